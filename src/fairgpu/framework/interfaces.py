"""Extension points, mirroring the Kubernetes scheduling framework.

Plugins see the engine only through `EngineView` and the `FitMask` handed to filters and scores.
Reserve is the engine's own step (ClusterState.assign); Bind is the driver's (it carries out `Bound`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol, runtime_checkable
from weakref import WeakKeyDictionary

import numpy as np
from numba import njit

from fairgpu.model.pod import PodSpec, Workload
from fairgpu.model.queue import QueueTree
from fairgpu.state import ClusterState, Footprint, Placement


@dataclass(slots=True)
class EngineView:
    """What plugins may read: cluster state, queue tree, and per-queue usage, demand and entitlement."""

    state: ClusterState
    tree: QueueTree
    capacity: np.ndarray  # (R,) cluster capacity over the fair dimensions
    usage: np.ndarray  # (Q, R) held by placed pods
    demand: np.ndarray  # (Q, R) running + pending
    entitled: np.ndarray  # (Q, R) fair share, refreshed at the start of each cycle
    usage_dom: np.ndarray  # (Q,) dominant share of usage
    entitled_dom: np.ndarray  # (Q,) dominant share of entitlement
    history_dom: np.ndarray  # (Q,) dominant share of decayed past usage (0 where half-life is 0)
    share_ratio: np.ndarray  # (Q,) (usage_dom + history_dom) / entitled_dom; inf when entitled to nothing
    now: float = 0.0

    def __post_init__(self) -> None:
        # load the compiled accounting now, not at the first placement (plugins/kernel_warmup.py says why)
        none = np.zeros(0, dtype=np.int64)
        _add_usage(
            self.usage,
            self.usage_dom,
            self.share_ratio,
            self.history_dom,
            self.entitled_dom,
            self.capacity,
            none,
            self.usage[:0],
            1,
        )

    def add_usage(self, queue: int, charges: Sequence[np.ndarray], sign: int = 1) -> None:
        """A queue (and so each ancestor) now holds each of `charges` more (`sign` -1: less), added in turn;
        keeps the derived shares current (computed once, after the last: a gang's pods come together)."""
        rows = charges[0][None] if len(charges) == 1 else np.array(charges, dtype=np.float64).reshape(len(charges), -1)
        _add_usage(
            self.usage, self.usage_dom, self.share_ratio, self.history_dom, self.entitled_dom, self.capacity,
            self.tree.paths_of[queue], rows, sign,
        )  # fmt: skip


@njit(cache=True)
def _add_usage(
    usage: np.ndarray,
    usage_dom: np.ndarray,
    ratio: np.ndarray,
    history_dom: np.ndarray,
    entitled_dom: np.ndarray,
    capacity: np.ndarray,
    queues: np.ndarray,
    charges: np.ndarray,
    sign: int,
) -> None:
    """EngineView.add_usage for `queues` (a leaf and its ancestors): each row of `charges` added to (or, with
    `sign` -1, taken from) each queue's usage in turn, then its dominant share (the largest usage over
    capacity where there is capacity, 0.0 if none) and share ratio (`fairness.share_ratio`), the same float
    operations in the same order as they were in Python (one compiled call: those steps on NumPy scalars and
    Python floats cost ~3 µs a placement)."""
    for j in range(queues.shape[0]):
        q = queues[j]
        for k in range(charges.shape[0]):
            for d in range(usage.shape[1]):
                usage[q, d] = usage[q, d] + charges[k, d] if sign > 0 else usage[q, d] - charges[k, d]
        dom, first = 0.0, True
        for d in range(usage.shape[1]):
            if capacity[d] > 0:
                share = usage[q, d] / capacity[d]
                if first or share > dom:  # as Python's max: the first of equals stays
                    dom, first = share, False
        usage_dom[q] = dom
        ratio[q] = (dom + history_dom[q]) / entitled_dom[q] if entitled_dom[q] > 0 else np.inf


@dataclass(slots=True)
class FitMask:
    """Nodes (and, for GPU pods, GPU slots) that can still take a pod, narrowed by each filter in turn.

    `rows` says which nodes the arrays describe, in order: every node (`slice(None)`), or only those whose
    state changed since the pod's shape was last evaluated (framework/evaluations.py). Filters and scores
    read the state's rows through it (`state.cpu_free[mask.rows]`) and answer for those rows only.
    `slots` may be an array owned by ClusterState: narrow it with `restrict_slots`, never in place.
    `slot_count` caches the per-node count of usable slots when a filter already knows it.
    """

    nodes: np.ndarray
    slots: np.ndarray | None = None
    slot_count: np.ndarray | None = None
    rows: np.ndarray | slice = field(default_factory=lambda: slice(None))

    def restrict_nodes(self, keep: np.ndarray) -> None:
        self.nodes = self.nodes & keep

    def restrict_slots(self, keep: np.ndarray, count: np.ndarray | None = None) -> None:
        self.slots = keep if self.slots is None else self.slots & keep
        self.slot_count = count if self.slots is keep else None

    def counts(self) -> np.ndarray:
        if self.slot_count is None:
            slots = np.ascontiguousarray(self.slots)
            if slots.shape[1] % 8 == 0 and slots.shape[1]:  # 8 booleans per word: count set bits (60x)
                words = np.bitwise_count(slots.view(np.uint64))
                self.slot_count = words.sum(axis=1) if words.shape[1] > 1 else words.ravel()
            else:
                self.slot_count = np.count_nonzero(slots, axis=1)
        return self.slot_count


class ActiveQueues:
    """The leaf queues that still have a workload to try in this cycle, and their head workloads.

    `count[i]` is how many active leaves lie in queue i's subtree (itself included), so a sort can
    descend the queue tree without looking at every leaf.
    """

    def __init__(self, tree: QueueTree, queues: list[int], head: Callable[[int], Workload]) -> None:
        self.tree = tree
        self.queues = set(queues)
        self.head = head
        self.count = np.zeros(len(tree), dtype=np.int64)
        for q in queues:
            self.count[tree.paths_of[q]] += 1

    def __bool__(self) -> bool:
        return bool(self.queues)

    def remove(self, q: int) -> None:
        self.queues.discard(q)
        self.count[self.tree.paths_of[q]] -= 1


@runtime_checkable
class QueueSort(Protocol):
    # "queue": each queue offers its workloads by its own policy (fair_within); "fifo": strictly by
    # priority then submit time, as one cluster-wide heap would
    within_queue: str
    # Optional (not part of the contract, so existing sorts still qualify): `borrowed`, the order a queue
    # offers capacity it borrows beyond its nominal share (framework/lending.py): "fifo" (the default, its own
    # order) or "soonest-end" (the work that would have ended first had it started when submitted)

    def pick(self, active: ActiveQueues, view: EngineView) -> int:
        """The leaf queue whose head workload is tried next. Each head is already its queue's
        highest-priority, oldest workload (or its least-served user's, for per-user queues)."""
        ...


@runtime_checkable
class Admit(Protocol):
    def admit(self, workload: Workload, queue: int, charge: np.ndarray, view: EngineView) -> str | None:
        """None to admit, else why not (shown to the user).

        Usage only grows within a cycle, so the engine takes a refusal to hold for every workload of the
        same queue and shape until the next cycle: decide on the queue and the charge, not on names.
        """
        ...


@runtime_checkable
class Filter(Protocol):
    NAME: ClassVar[str]  # how profiles name it, and the reason given for nodes it rules out
    # Optional (not part of the contract, so existing filters still qualify), found by `getattr`:
    # `indifferent(pod, view) -> bool`, True when `filter` keeps every node and slot for that pod on that state
    # for as long as the state lives (NodeAffinity for a pod without node constraints on an untainted cluster):
    # the engine leaves it out of the pod's filters. `filter_into(pod, view, rows, nodes, slots) -> FitMask |
    # None`, for the pod's only filter left: its verdicts on `rows` (node indices, or every node) written into
    # the pod shape's own (N,) `nodes` and (N, G) `slots` (None for a pod without GPUs) at those rows and
    # returned as the rows' mask, or None where it has no such path for the pod (then `filter` runs)

    def filter(self, pod: PodSpec, view: EngineView, mask: FitMask) -> None:
        """Narrow `mask` (its `rows`) to the nodes and slots that can hold the pod. A node's verdict may
        depend only on the pod and that node: the engine keeps verdicts until the node's state changes."""
        ...


@runtime_checkable
class ExplainsFilter(Protocol):
    """A Filter that can say why each node fails it, for explanations (else its NAME is the reason)."""

    def reasons(self, pod: PodSpec, view: EngineView) -> list[tuple[str, np.ndarray]]:
        """(reason, (N,) bool: nodes failing for it), in order: a node counts under the first that holds."""
        ...


@runtime_checkable
class Score(Protocol):
    # Optional (not part of the contract, so existing scores still qualify): `indifferent(pod) -> bool`, True
    # when `score` would give every node 0 for that pod (PodPolicy for a pod without a node policy): the
    # engine then leaves the plugin out of the pod's weighted sum, which that 0 would not change.
    # `add_weighted(pod, view, mask, weight, total) -> np.ndarray`: a new array of the float64 `total` (the sum so
    # far, of mask's rows) + weight × `score(pod, view, mask)`, the same floats as that product and sum in NumPy,
    # without the scores' own array; the engine calls it for any plugin but the first it sums
    def generation(self, pod: PodSpec, view: EngineView) -> int:
        """Called each time a pod is about to be scored (some node fits it), before `score`, dry runs
        included. Scores computed under another generation are stale on every node; within one, a node's
        score may depend only on the pod and that node's state."""
        ...

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        """Scores in 0..100 of the nodes `mask.rows`, higher is better; values of nodes outside
        mask.nodes are ignored."""
        ...

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray | None:
        """The candidate slots of the chosen node, best first; None leaves the order to the next plugin."""
        ...


@runtime_checkable
class Learns(Protocol):
    """A Score plugin that learns from the pods it is asked to place (Fragmentation: the workload mix)."""

    def learn(self, key: str, pod: PodSpec) -> None:
        """A pod some node fits is about to be placed for real (not in a dry run), under its ledger key;
        called before `generation`. The same pod comes again on every attempt (each cycle, each gang
        retry): a plugin that counts pods counts each key once."""
        ...


class NodeLocal:
    """Base of Score plugins whose scores depend on the pod and the node alone: one generation forever."""

    __slots__ = ()

    def generation(self, pod: PodSpec, view: EngineView) -> int:
        return 0


@runtime_checkable
class Permit(Protocol):
    def permit(self, workload: Workload, placed: int) -> bool:
        """May the pods reserved so far (placed of len(workload.pods)) be kept?"""
        ...


@dataclass(slots=True)
class Profile:
    """A named set of plugins per extension point (framework/profile.py parses one from YAML)."""

    name: str
    queue_sort: QueueSort
    admit: list[Admit] = field(default_factory=list)
    filter: list[Filter] = field(default_factory=list)
    score: list[tuple[Score, float]] = field(default_factory=list)
    permit: list[Permit] = field(default_factory=list)
    preempt: list[Preempt] = field(default_factory=list)
    description: str = ""
    reserve: bool = False  # hold nodes for a workload that waited past its queue's starvation_after
    # Workloads are gangs: their pods are placed together (on as few nodes as the scores allow), failures
    # are remembered per whole-workload shape, and the Permit plugins decide whether a partial placement
    # may be kept. Off, each pod is placed on its own, as kube-scheduler does.
    gang: bool = False
    # per cluster state: filter and score results by pod shape, kept current (framework/evaluations.py)
    evaluations: WeakKeyDictionary[ClusterState, Any] = field(
        default_factory=WeakKeyDictionary, repr=False, compare=False
    )


@dataclass(slots=True, frozen=True)
class VictimUnit:
    """What one eviction would take away: a whole running workload, or an elastic workload's extra pods."""

    workload: Workload
    queue: int
    started: float
    pods: tuple[int, ...]  # pod indices it evicts
    placements: tuple[Placement, ...]  # where those pods run
    charge: np.ndarray  # fair vector those pods hold
    whole: bool  # False: only pods above an elastic workload's min_pods


class VictimUnits:
    """The table's units in order, each made on first use: a decision reads a handful of thousands."""

    __slots__ = ("_count", "_made", "_make")

    def __init__(self, count: int, make: Callable[[int], VictimUnit]) -> None:
        self._count, self._make = count, make
        self._made: dict[int, VictimUnit] = {}

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i: int) -> VictimUnit:
        i = int(i)
        if not -self._count <= i < self._count:
            raise IndexError(i)
        i %= self._count
        unit = self._made.get(i)
        if unit is None:
            unit = self._made[i] = self._make(i)
        return unit

    def __iter__(self) -> Iterator[VictimUnit]:
        return (self[i] for i in range(self._count))


@dataclass(slots=True)
class VictimTable:
    """Every unit of running work that could be evicted, as arrays for vectorised policy and cost."""

    units: VictimUnits
    queue: np.ndarray  # (U,)
    started: np.ndarray
    priority: np.ndarray
    preemptible: np.ndarray  # bool
    whole: np.ndarray  # bool
    charge: np.ndarray  # (U, R)
    footprint: Footprint  # rows tagged by unit
    alive: np.ndarray  # bool: False once it is being evicted

    def once(self, units: np.ndarray) -> np.ndarray:
        """These units (a boolean per unit) without the extra pods whose whole workload is among them: an
        elastic workload's extra pod is a unit of its own right after its whole workload's, which holds it
        too, so chosen with it, it is evicted and freed once."""
        twice = units & ~self.whole
        twice[1:] &= units[:-1]
        twice[0] = False
        kept: np.ndarray = units & ~twice
        return kept

    def freed(self, units: np.ndarray) -> Footprint:
        """What evicting these units (a boolean per unit) frees, each pod once."""
        return self.footprint.select(self.once(units))


@dataclass(slots=True)
class PreemptContext:
    """What a Preempt plugin decides with: the workload that does not fit, the running work it could
    displace (units being evicted already are not alive), and dry runs over copies of the cluster state."""

    workload: Workload
    queue: int
    charge: np.ndarray  # fair vector of the pods still to place
    pods: tuple[PodSpec, ...]  # the pods still to place
    view: EngineView
    now: float
    table: Callable[[], VictimTable]  # built on first use: deciding not to preempt needs no table
    profile: Profile  # for dry-run placement
    usage: np.ndarray  # (Q, R) as it will be once evictions already under way complete
    exclude: np.ndarray | None = None  # (N,) nodes held for other workloads, which it may not use
    # when the pods would start with no eviction, as running work ends when expected (inf: never, or unknown)
    unaided_start: Callable[[], float] = lambda: math.inf
    # (queue, GPUs) -> when that queue's running work, ending when expected and starting nothing new, holds no
    # more than that many GPUs (inf: never, or an end unknown); evictions under way count as gone
    drained: Callable[[int, float], float] = lambda queue, gpus: math.inf
    # (workload, its queue) -> its expected run time: its own duration, else its queue's learned one (None)
    run_time: Callable[[Workload, int], float | None] = lambda workload, queue: workload.duration

    _victims: VictimTable | None = None

    @property
    def victims(self) -> VictimTable:
        if self._victims is None:
            self._victims = self.table()
        return self._victims

    def potential(self, units: np.ndarray) -> EngineView:
        """A view over a copy of the cluster as it would be with these units (a boolean per unit) evicted."""
        return replace(self.view, state=self.view.state.without(self.victims.freed(units)))

    @contextmanager
    def dry_run(self, units: np.ndarray) -> Iterator[EngineView]:
        """The view itself, its cluster as it would be with these units evicted until the block ends
        (ClusterState.dry_run): placing pods there rescores only the nodes that changed, where a copy
        (`potential`) starts every plugin's per-state caches afresh."""
        with self.view.state.dry_run(self.victims.freed(units)):
            yield self.view


@runtime_checkable
class Preempt(Protocol):
    def preempt(self, ctx: PreemptContext) -> np.ndarray | None:
        """Which units (indices into ctx.victims) to evict so that the workload fits, verified by a
        dry-run placement; None if it should not preempt."""
        ...

    def may_find(self, view: EngineView, queue: int, charge: np.ndarray, least_usage: np.ndarray) -> bool:
        """False only if preempt() surely finds no victim for a workload of this queue still to place
        `charge`, whatever runs: judged from the queue policies and `least_usage`, a lower bound on the
        queue's row of ctx.usage. The engine then skips setting the search up (most shapes that do not fit,
        where no queue may evict, would otherwise each pay for one)."""
        ...


@dataclass(slots=True, frozen=True)
class Bound:
    """Decision: bind pod `pod` of workload `workload` at `placement` (the driver carries it out)."""

    workload: str
    pod: int
    pod_name: str
    placement: Placement


@dataclass(slots=True, frozen=True)
class Evict:
    """Decision: evict a running workload for `reason`, giving it `grace` seconds (its queue's grace period);
    its resources are free at `at`. `pods` names only an elastic workload's extra pods; None means the whole
    workload."""

    workload: str
    reason: str
    at: float = 0.0
    pods: tuple[int, ...] | None = None
    grace: float = 0.0
