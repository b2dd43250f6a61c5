"""The engine: pending workloads per queue, and the scheduling cycle that drives the plugins.

Pure and synchronous: drivers (the simulator, the Kubernetes controller) call submit/remove/cycle with
timestamps and carry out the decisions `cycle` returns.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fairgpu import fairness
from fairgpu import resources as r
from fairgpu.errors import RequestError, StateError
from fairgpu.framework import placement as pl
from fairgpu.framework.backlog import Backlog
from fairgpu.framework.explain import Explanation, explain
from fairgpu.framework.interfaces import (
    ActiveQueues,
    Bound,
    EngineView,
    Evict,
    PreemptContext,
    VictimTable,
    VictimUnit,
)
from fairgpu.framework.lookahead import Fit, Planned, replay
from fairgpu.framework.profile import Profile
from fairgpu.model.node import NodeSpec
from fairgpu.model.pod import PodSpec, Workload
from fairgpu.model.queue import QueueTree
from fairgpu.state import ClusterState, Footprint, Placement


@dataclass(slots=True)
class Entry:
    """A submitted workload as the engine tracks it."""

    workload: Workload
    queue: int
    seq: int
    charge: np.ndarray  # the whole workload's fair vector
    share: float  # its dominant share of the cluster
    placed: list[Placement] = field(default_factory=list)
    key: int = -1  # id of what must fit next: failures are cached by it within a cycle
    terminating: bool = False  # being evicted: holds its resources until the driver removes it
    leaving: np.ndarray | None = None  # fair vector the eviction takes away
    version: int = 0  # bumped whenever its placements change
    footprint: tuple | None = None  # (version, pod rows, slot rows, charge held): victim-table cache
    order: tuple[float, float, int] = ()  # (-priority, submit time, seq): its place within its queue
    started: float | None = None

    @property
    def user(self) -> str:
        return self.workload.user

    @property
    def expected_end(self) -> float:
        d = self.workload.duration
        return math.inf if self.started is None or d is None else self.started + d

    def __lt__(self, other: Entry) -> bool:
        return self.order < other.order


@dataclass(slots=True)
class Reservation:
    """Nodes held for a workload — one starving, or one whose victims are being evicted: others may use
    them only if they end before `fit.at`."""

    workload: str
    fit: Fit
    exclude: np.ndarray  # (N,) bool
    starving: bool
    queue: int
    planned: tuple[Placement, ...] = ()  # a preemptor's: where its pods go once its victims are gone
    victims: tuple[tuple[str, Footprint], ...] = ()  # a preemptor's: what each victim workload gives up


@dataclass(slots=True)
class CycleResult:
    bound: list[Bound] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # workloads whose pods now all run
    evictions: list[Evict] = field(default_factory=list)
    attempts: int = 0


class Scheduler:
    def __init__(self, nodes: list[NodeSpec], tree: QueueTree, profile: Profile) -> None:
        self.state = ClusterState(nodes)
        self.tree = tree
        self.profile = copy.deepcopy(profile)  # plugins may learn (e.g. the pod mix): one engine, one copy
        self.gang = profile.gang
        q, dims = len(tree), len(r.FAIR_DIMS)
        self.view = EngineView(
            state=self.state,
            tree=tree,
            capacity=self.state.capacity_vector(),
            usage=np.zeros((q, dims)),
            demand=np.zeros((q, dims)),
            entitled=np.zeros((q, dims)),
            usage_dom=np.zeros(q),
            entitled_dom=np.zeros(q),
            history_dom=np.zeros(q),
            share_ratio=np.zeros(q),
        )
        self._mean_mem = self.state.mean_gpu_memory_mib()
        honour = profile.queue_sort.within_queue == "queue"
        self.backlogs = [Backlog(by_user=honour and spec.fair_within == "users") for spec in tree.queues]
        self._keys: list[Counter[int]] = [Counter() for _ in range(q)]  # live attempt-key ids per queue
        self._key_ids: dict[tuple, int] = {}  # attempt key (pod shapes) → small int, cheap to hash
        self.pending: dict[str, Entry] = {}
        self.running: dict[str, Entry] = {}
        self._charges: dict[PodSpec, np.ndarray] = {}
        self._seq = 0
        # Decayed usage: integral of past usage (resource-seconds) with each queue's half-life.
        self._decay_rate = np.where(tree.half_life > 0, math.log(2) / np.maximum(tree.half_life, 1e-9), 0.0)
        self._history = np.zeros((q, dims))
        self._history_t: float | None = None
        self.reservations: dict[str, Reservation] = {}  # by the workload they hold nodes for
        self._growable: set[str] = set()  # running elastic workloads below their full size
        self._leaving = np.zeros((q, dims))  # what evictions under way will take from each queue
        self._max_grace = max((spec.preemption.grace_period for spec in tree.queues), default=0.0)
        self._placement_version = 0  # bumped on every assign/release, so cached victim tables know
        self._victim_version = -1
        self._victim_table: VictimTable | None = None
        self._victim_index: dict[str, list[int]] = {}
        self._refused: dict[str, float] = {}  # victims whose eviction was refused → when they may be tried again
        self._evicted_for: dict[str, str] = {}  # victim being evicted → the preemptor it makes room for

    # -- events from the driver ---------------------------------------------------------------------
    def submit(self, wl: Workload) -> None:
        """Queue a workload. Raises RequestError (nothing changed) if it can never be placed."""
        entry = self._entry(wl)
        for pod in wl.pods:
            problem = self.state.unplaceable_reason(pod)
            if problem:
                raise RequestError(f"workload {wl.name}: {problem}")
        self._seq += 1
        entry.key = self._attempt_key(entry)
        self.pending[wl.name] = entry
        self.backlogs[entry.queue].push(entry)
        self._keys[entry.queue][entry.key] += 1
        self.view.demand[entry.queue] += entry.charge

    def adopt(self, wl: Workload, placements: Sequence[Placement], started: float) -> None:
        """A workload found running where `placements` say (after a restart, or a rebuild of the engine): it
        is charged to its queue and may be preempted like one this engine placed. Raises RequestError for a
        queue it cannot be in, StateError if the placements do not fit; either way nothing changed."""
        entry = self._entry(wl)
        if len(placements) != len(wl.pods):
            raise RequestError(f"workload {wl.name}: {len(wl.pods)} pods but {len(placements)} placements")
        for i, p in enumerate(placements):
            try:
                self.state.assign(wl.pod_names[i], p)
            except StateError:
                for j in range(i):
                    self.state.release(wl.pod_names[j])
                raise
        self._seq += 1
        entry.started = started
        self.running[wl.name] = entry
        self.view.demand[entry.queue] += entry.charge
        for pod, p in zip(wl.pods, placements, strict=True):
            entry.placed.append(p)
            self._account(entry, pod, +1)

    def _entry(self, wl: Workload) -> Entry:
        """A new entry for a workload of a leaf queue, not yet registered anywhere."""
        if wl.name in self.pending or wl.name in self.running:
            raise RequestError(f"workload {wl.name}: already submitted")
        qi = self.tree.index.get(wl.queue)
        if qi is None:
            raise RequestError(f"workload {wl.name}: queue {wl.queue!r} does not exist")
        if not self.tree.is_leaf[qi]:
            raise RequestError(f"workload {wl.name}: queue {wl.queue!r} has child queues; submit to a leaf")
        charge = sum((self._charge(p) for p in wl.pods), r.zeros())
        entry = Entry(wl, qi, self._seq, charge, float(fairness.dominant_shares(charge, self.view.capacity)))
        entry.order = (-wl.priority, wl.submit_time, self._seq)
        return entry

    def remove(self, name: str) -> list[Placement]:
        """A workload finished or was deleted: release whatever it holds. Returns the released placements."""
        self._growable.discard(name)
        self._refused.pop(name, None)
        self._evicted_for.pop(name, None)
        entry = self.running.pop(name, None)
        if entry is None:
            entry = self.pending.pop(name, None)
            if entry is None:
                raise KeyError(name)
            self.backlogs[entry.queue].remove(entry)
            self._forget_key(entry)
        self._forget_leaving(entry)
        released = [self._release(entry, i) for i in range(len(entry.placed))]
        entry.placed.clear()
        self.view.demand[entry.queue] -= entry.charge
        self.reservations.pop(name, None)
        return released

    def shrink(self, name: str, pods: tuple[int, ...], regrow: bool = True) -> list[Placement]:
        """An elastic workload's extra pods were evicted: release them. They can grow back later, unless
        `regrow` is False: then they are gone for good (a cluster deleted them; replacements arrive as new
        work) and the workload keeps only the pods it still runs."""
        entry = self.running[name]
        n = len(entry.placed)
        if sorted(pods) != list(range(n - len(pods), n)) or n - len(pods) < entry.workload.needed:
            raise ValueError(f"workload {name}: only its newest pods above min_pods can be shrunk")
        released = []
        for _ in pods:  # placed pods stay a prefix: the newest go first
            released.append(self._release(entry, len(entry.placed) - 1))
            entry.placed.pop()
        self._forget_leaving(entry)
        self._evicted_for.pop(name, None)
        if regrow:
            self._growable.add(name)
        else:
            self._truncate(entry)
        return released

    def _truncate(self, entry: Entry) -> None:
        """The workload becomes the pods it has placed: its size, charge and demand shrink to them."""
        wl, n = entry.workload, len(entry.placed)
        charge = self._pods_charge(wl, tuple(range(n)))
        self.view.demand[entry.queue] += charge - entry.charge
        entry.workload = replace(wl, pods=wl.pods[:n], pod_names=wl.pod_names[:n])
        entry.charge = charge
        entry.share = float(fairness.dominant_shares(charge, self.view.capacity))
        self._growable.discard(wl.name)

    def eviction_refused(self, name: str, retry_at: float) -> None:
        """The driver could not evict a victim (a PodDisruptionBudget said no): it keeps running, stops
        counting as leaving, and is not chosen as a victim again before `retry_at`. The preemptor it was
        to make room for loses the room it planned with, so its next attempt picks another victim."""
        entry = self.running.get(name)
        if entry is None:
            return
        self._forget_leaving(entry)
        self._refused[name] = retry_at
        preemptor = self._evicted_for.pop(name, "")
        held = self.reservations.get(preemptor)
        if held is not None and not held.starving:
            del self.reservations[preemptor]
        self._placement_version += 1  # the cached victim table marks it as leaving: rebuild it

    def _forget_leaving(self, entry: Entry) -> None:
        if entry.terminating and entry.leaving is not None:
            for q in self.tree.paths_of[entry.queue]:
                self._leaving[q] -= entry.leaving
        entry.terminating, entry.leaving = False, None

    # -- queries ------------------------------------------------------------------------------------
    def is_backlogged(self) -> np.ndarray:
        """(Q,) whether each queue has pending workloads."""
        return np.array([len(b) > 0 for b in self.backlogs], dtype=bool)

    def refresh_shares(self, now: float) -> None:
        """Decay usage history to `now` and recompute entitlements and every queue's share ratio."""
        v = self.view
        self._decay(now)
        v.entitled = fairness.entitlements(self.tree, v.capacity, v.demand)
        v.entitled_dom = fairness.dominant_shares(v.entitled, v.capacity)
        v.usage_dom = fairness.dominant_shares(v.usage, v.capacity)
        v.history_dom = fairness.dominant_shares(self._history * self._decay_rate[:, None], v.capacity)
        v.share_ratio = fairness.share_ratio(v.usage_dom + v.history_dom, v.entitled_dom)

    def running_ends(self) -> list[tuple[float, list[str]]]:
        """(expected end, pod keys) of every placed workload, running or partly placed."""
        out = [(e.expected_end, list(e.workload.pod_names[: len(e.placed)])) for e in self.running.values()]
        out += [(math.inf, list(e.workload.pod_names[: len(e.placed)])) for e in self.pending.values() if e.placed]
        return [(t, keys) for t, keys in out if math.isfinite(t)]

    def explain(self, name: str, now: float) -> Explanation:
        """Why a workload is pending, its place in its queue and in the cluster, and its estimated start."""
        return explain(self, name, now)

    # -- the scheduling cycle -----------------------------------------------------------------------
    def cycle(self, now: float) -> CycleResult:
        """Place what fits, in the profile's order; an unschedulable workload never blocks those behind it."""
        result = CycleResult()
        for _ in self.steps(now, result):
            pass
        return result

    def steps(self, now: float, result: CycleResult) -> Iterator[None]:
        """The cycle one attempt at a time (decisions accumulate in `result`), so a driver can time each
        decision or stop early; closing the generator early leaves every unattempted workload pending."""
        self.view.now = now
        self.refresh_shares(now)
        failed: set[int] = set()  # shapes that did not fit: capacity only shrinks within a cycle
        failed_outside: set[int] = set()  # ... kept out of reserved nodes (they fit in less)
        refused: list[set[int]] = [set() for _ in self.backlogs]  # per queue, by admission
        skipped: dict[int, list[Entry]] = {}
        attempted: set[str] = set()  # this cycle, in order
        # (queue, shape) that neither fits nor can make room by preemption this cycle; a queue offers
        # the highest priority first, so a failure holds for the rest of its workloads of that shape
        hopeless: set[tuple[int, int]] = set()
        backlogs = self.backlogs
        active = ActiveQueues(
            self.tree, [q for q, b in enumerate(backlogs) if b], lambda q: backlogs[q].peek().workload
        )
        try:
            while active:
                q = self.profile.queue_sort.pick(active, self.view)
                entry = self.backlogs[q].pop()
                attempted.add(entry.workload.name)
                exclude = self.reserved_for_others(entry, now)
                # Kept out of reserved nodes, a workload fits in less: its failures are cached apart, but a
                # queue whose every shape failed either way counts as done for this cycle (a short job
                # that could have backfilled behind a long one of its shape waits for the next cycle).
                shapes_failed = failed if exclude is None else failed_outside
                if entry.key in refused[q]:
                    skipped.setdefault(q, []).append(entry)
                elif entry.key in shapes_failed:  # does not fit: it may still make room by preemption
                    skipped.setdefault(q, []).append(entry)
                    self._preempt_once(entry, now, result, hopeless)
                elif self.admission_refusal(entry) is not None:
                    refused[q].add(entry.key)
                    skipped.setdefault(q, []).append(entry)
                elif self._try_place(entry, result, exclude):
                    self._start(entry, result, now)
                else:
                    shapes_failed.add(entry.key)
                    skipped.setdefault(q, []).append(entry)
                    self._on_unschedulable(entry, now, result, attempted, hopeless)
                live = self._keys[q].keys()
                if not self.backlogs[q] or all(
                    k in refused[q] or ((k in failed or k in failed_outside) and (q, k) in hopeless) for k in live
                ):
                    active.remove(q)
                result.attempts += 1
                yield
            yield from self._grow(now, result)
        finally:
            for q, entries in skipped.items():
                for entry in entries:
                    self.backlogs[q].push(entry)

    def _grow(self, now: float, result: CycleResult) -> Iterator[None]:
        """After every pending workload had its turn, elastic workloads grow into what is left, the
        queue furthest below its share first, one pod at a time."""
        growing = [e for n in self._growable if not (e := self.running[n]).terminating]
        growing.sort(key=lambda e: (self.view.share_ratio[e.queue], e.order))
        for entry in growing:
            wl = entry.workload
            exclude = self.reserved_for_others(entry, now)
            while len(entry.placed) < len(wl.pods):
                i = len(entry.placed)
                pod = wl.pods[i]
                if any(a.admit(wl, entry.queue, self._charge(pod), self.view) for a in self.profile.admit):
                    break
                placement = pl.place_pod(pod, self.view, self.profile, exclude)
                if placement is None:
                    break
                self.state.assign(wl.pod_names[i], placement)
                entry.placed.append(placement)
                self._account(entry, pod, +1)
                result.bound.append(Bound(wl.name, i, wl.pod_names[i], placement))
            if len(entry.placed) == len(wl.pods):
                self._growable.discard(wl.name)
            result.attempts += 1
            yield

    def admission_refusal(self, entry: Entry) -> str | None:
        """Why the profile's Admit plugins refuse the rest of this workload now; None if they admit it."""
        remaining = entry.charge - sum((self._charge(p) for p in self._placed_pods(entry)), r.zeros())
        for plugin in self.profile.admit:
            reason = plugin.admit(entry.workload, entry.queue, remaining, self.view)
            if reason is not None:
                return reason
        return None

    def _try_place(self, entry: Entry, result: CycleResult, exclude: np.ndarray | None) -> bool:
        wl = entry.workload
        first_new = len(entry.placed)
        todo = range(first_new, len(wl.pods))
        placed = pl.place_all(
            [wl.pods[i] for i in todo], [wl.pod_names[i] for i in todo], self.view, self.profile, exclude
        )
        for i, p in zip(todo, placed, strict=False):
            entry.placed.append(p)
            self._account(entry, wl.pods[i], +1)
        if len(entry.placed) < len(wl.pods) and any(not p.permit(wl, len(entry.placed)) for p in self.profile.permit):
            while len(entry.placed) > first_new:
                self._release(entry, len(entry.placed) - 1)
                entry.placed.pop()
            return False
        for i in range(first_new, len(entry.placed)):
            result.bound.append(Bound(wl.name, i, wl.pod_names[i], entry.placed[i]))
        if len(entry.placed) < wl.needed:
            self._forget_key(entry)
            entry.key = self._attempt_key(entry)
            self._keys[entry.queue][entry.key] += 1
            return False
        return True

    def _start(self, entry: Entry, result: CycleResult, now: float) -> None:
        del self.pending[entry.workload.name]
        self._forget_key(entry)
        entry.started = now
        self.running[entry.workload.name] = entry
        if len(entry.placed) < len(entry.workload.pods):
            self._growable.add(entry.workload.name)  # elastic: grows into idle capacity after each cycle
        result.started.append(entry.workload.name)
        self.reservations.pop(entry.workload.name, None)

    def _on_unschedulable(
        self, entry: Entry, now: float, result: CycleResult, attempted: set[str], hopeless: set[tuple[int, int]]
    ) -> None:
        """A workload that is next in order does not fit: preempt for it if its queue's policy allows,
        else reserve the soonest-freeing nodes if it starves."""
        wl = entry.workload
        if wl.name in self.reservations or self._preempt_once(entry, now, result, hopeless):
            return  # holding nodes (its victims are leaving, or it waits for them to free), or now will
        starving = now - wl.submit_time >= self.tree.queues[entry.queue].starvation_after
        # One starving workload holds nodes at a time; one ahead of it in this cycle's order takes over.
        holder = next((n for n, res in self.reservations.items() if res.starving), None)
        if holder is not None and holder not in attempted:
            del self.reservations[holder]
            holder = None
        if self.profile.reserve and starving and holder is None and not entry.placed:
            held = self.reserved_for_others(entry, now)
            fit = replay([Planned(wl.pods, wl.duration)], self.view, self.profile, now, self.running_ends(), held)
            if fit is not None:
                self._reserve(entry, fit, starving=True)

    def _preempt_once(self, entry: Entry, now: float, result: CycleResult, hopeless: set[tuple[int, int]]) -> bool:
        """Preempt for a workload that does not fit, unless its queue may not or its shape already failed to
        make room this cycle. True if victims are now being evicted for it."""
        shape = (entry.queue, entry.key)
        if entry.workload.name in self.reservations or shape in hopeless:
            return False
        may = self.profile.preempt and self.tree.queues[entry.queue].preemption.enabled
        if may and self._preempt(entry, now, result):
            return True
        hopeless.add(shape)
        return False

    def _preempt(self, entry: Entry, now: float, result: CycleResult) -> bool:
        wl = entry.workload
        rest = wl.pods[len(entry.placed) :]
        charge = entry.charge - sum((self._charge(p) for p in self._placed_pods(entry)), r.zeros())
        # It starts only when its victims' grace has passed: plan around reservations it would then meet.
        usage, exclude = (
            self._committed_usage(),
            self.reserved_for_others(entry, now, now + self._max_grace, preempting=True),
        )
        view = self._planned_view(entry)
        ctx = PreemptContext(wl, entry.queue, charge, rest, view, now, self._victims, self.profile, usage, exclude)
        for plugin in self.profile.preempt:
            chosen = plugin.preempt(ctx)
            if chosen is None or not len(chosen):
                continue
            at, nodes, table = now, set(), ctx.victims
            for i in chosen:
                unit = table.units[i]
                victim = self.running[unit.workload.name]
                grace = self.tree.queues[victim.queue].preemption.grace_period
                at = max(at, now + grace)
                victim.terminating = True
                victim.leaving = unit.charge
                for q in self.tree.paths_of[victim.queue]:
                    self._leaving[q] += unit.charge
                table.alive[self._victim_index[victim.workload.name]] = False
                self._evicted_for[victim.workload.name] = wl.name
                nodes.update(p.node for p in unit.placements)
                pods = None if unit.whole else unit.pods
                result.evictions.append(
                    Evict(victim.workload.name, f"preempted for {wl.name}", now + grace, pods, grace)
                )
            # Hold every node its pods will need, not only the victims': free GPUs it counts on elsewhere
            # must not go to others while the victims leave.
            gone = np.zeros(len(table.units), dtype=bool)
            gone[chosen] = True
            keys = [f"\0reserve-{i}" for i in range(len(rest))]
            planned = tuple(pl.place_all(rest, keys, ctx.potential(gone), self.profile, exclude))
            nodes.update(p.node for p in planned)
            unit = np.arange(len(gone))
            given = tuple((table.units[i].workload.name, table.footprint.select(unit == i)) for i in chosen)
            self._reserve(entry, Fit(at, frozenset(nodes)), starving=False, planned=planned, victims=given)
            return True
        return False

    def _planned_view(self, entry: Entry) -> EngineView:
        """The cluster a preemptor plans in. Preemptors of one queue share the room eviction makes, so room
        another of them already planned with is taken: what its victims give up freed (while they are still
        leaving), its pods where they will go. Two of them never count on the same free GPUs (one would find
        its room gone, and preempt again)."""
        others = [
            res
            for name, res in self.reservations.items()
            if name != entry.workload.name and not res.starving and res.queue == entry.queue and res.planned
        ]
        if not others:
            return self.view
        leaving = [
            fp
            for res in others
            for victim, fp in res.victims
            if (held := self.running.get(victim)) is not None and held.terminating
        ]
        state = self.state.without(Footprint.union(leaving)) if leaving else self.state.copy()
        for res in others:
            for i, p in enumerate(res.planned):
                if state.fits(p):
                    state.assign(f"\0planned-{res.workload}-{i}", p)
        return replace(self.view, state=state)

    def _committed_usage(self) -> np.ndarray:
        """(Q, R) usage as it will be once evictions under way complete: victims' leaving charge gone,
        and what preemptors already made room for counted as theirs."""
        usage = self.view.usage - self._leaving
        for name, res in self.reservations.items():
            e = self.pending.get(name)
            if not res.starving and e is not None:
                for q in self.tree.paths_of[e.queue]:
                    usage[q] += e.charge
        return usage

    def _victims(self) -> VictimTable:
        """Running work that could be evicted — whole workloads, and each elastic workload's newest extra
        pod — as arrays; rebuilt only when what runs has changed since the last preemption decision, from
        per-workload rows that are recomputed only for workloads whose placements changed."""
        if any(at <= self.view.now for at in self._refused.values()):  # refusals past their back-off
            self._refused = {n: at for n, at in self._refused.items() if at > self.view.now}
            self._placement_version += 1
        if self._victim_table is not None and self._victim_version == self._placement_version:
            return self._victim_table
        units: list[VictimUnit] = []
        index: dict[str, list[int]] = {}
        pod_rows: list[tuple[int, int, int, int]] = []
        slot_rows: list[tuple[int, int, int, int, int]] = []
        for e in self.running.values():
            if e.started is None:
                continue
            if e.footprint is None or e.footprint[0] != e.version:
                held = self._pods_charge(e.workload, tuple(range(len(e.placed))))
                pods_of = [(p.node, p.cpu_m, p.memory_mib) for p in e.placed]
                slots_of = [
                    [(p.node, s, p.cores, m) for s, m in zip(p.slots, p.mem_mib, strict=True)] for p in e.placed
                ]
                e.footprint = (e.version, pods_of, slots_of, held)
            _, pods_of, slots_of, held = e.footprint
            wl, n = e.workload, len(e.placed)
            u = len(units)
            index[wl.name] = [u]
            units.append(VictimUnit(wl, e.queue, e.started, tuple(range(n)), tuple(e.placed), held, True))
            pod_rows += [(*row, u) for row in pods_of]
            slot_rows += [(*row, u) for rows in slots_of for row in rows]
            if n > wl.needed:  # elastic: the newest extra pod goes first (placed pods stay a prefix)
                u += 1
                index[wl.name].append(u)
                last = (n - 1,)
                units.append(
                    VictimUnit(wl, e.queue, e.started, last, (e.placed[-1],), self._pods_charge(wl, last), False)
                )
                pod_rows.append((*pods_of[-1], u))
                slot_rows += [(*row, u) for row in slots_of[-1]]
        table = VictimTable.of(units, len(r.FAIR_DIMS), Footprint.from_rows(pod_rows, slot_rows))
        for name, ids in index.items():
            if self.running[name].terminating or name in self._refused:
                table.alive[ids] = False
        self._victim_table, self._victim_index, self._victim_version = table, index, self._placement_version
        return table

    def _pods_charge(self, wl: Workload, pods: tuple[int, ...]) -> np.ndarray:
        return sum((self._charge(wl.pods[i]) for i in pods), r.zeros())

    def _reserve(
        self,
        entry: Entry,
        fit: Fit,
        starving: bool,
        planned: tuple[Placement, ...] = (),
        victims: tuple[tuple[str, Footprint], ...] = (),
    ) -> None:
        exclude = np.zeros(self.state.num_nodes, dtype=bool)
        exclude[list(fit.nodes)] = True
        name = entry.workload.name
        self.reservations[name] = Reservation(name, fit, exclude, starving, entry.queue, planned, victims)

    def reserved_for_others(
        self, entry: Entry, now: float, start: float | None = None, preempting: bool = False
    ) -> np.ndarray | None:
        """Nodes this workload must avoid: reservations for others that it would still be running into,
        if it started at `start` (default now). Room made by preemption is shared by that queue's preempting
        workloads (their victims are chosen together; `preempting`: it is choosing victims now), and held
        from everyone else."""
        own = self.reservations.get(entry.workload.name)
        preempting = preempting or (own is not None and not own.starving)
        exclude = None
        for name, res in list(self.reservations.items()):
            if name == entry.workload.name or (preempting and (res.starving or res.queue == entry.queue)):
                continue  # a preemptor keeps the room it planned with, even if a starving gang came later
            if now > res.fit.at:  # the time passed without it starting: look again
                del self.reservations[name]
                continue
            d = entry.workload.duration
            if d is None or (now if start is None else start) + d > res.fit.at:
                exclude = res.exclude if exclude is None else exclude | res.exclude
        return exclude

    # -- bookkeeping --------------------------------------------------------------------------------
    def _charge(self, pod: PodSpec) -> np.ndarray:
        c = self._charges.get(pod)
        if c is None:
            c = self._charges[pod] = pod.charge(self._mean_mem)
        return c

    def _placed_pods(self, entry: Entry) -> tuple[PodSpec, ...]:
        return entry.workload.pods[: len(entry.placed)]

    def _account(self, entry: Entry, pod: PodSpec, sign: int) -> None:
        self._placement_version += 1
        entry.version += 1
        charge = sign * self._charge(pod)
        self.backlogs[entry.queue].account(entry.user, float(fairness.dominant_shares(charge, self.view.capacity)))
        self.view.add_usage(entry.queue, charge)

    def _release(self, entry: Entry, i: int) -> Placement:
        wl = entry.workload
        placement = self.state.release(wl.pod_names[i])
        self._account(entry, wl.pods[i], -1)
        return placement

    def _decay(self, now: float) -> None:
        if self._history_t is not None and now > self._history_t:
            lam = self._decay_rate
            keep = np.exp(-lam * (now - self._history_t))
            # exact integral of constant usage over the interval, decayed to `now`
            gained = np.where(lam > 0, (1 - keep) / np.where(lam > 0, lam, 1.0), 0.0)
            self._history = self._history * keep[:, None] + self.view.usage * gained[:, None]
        self._history_t = now if self._history_t is None else max(self._history_t, now)

    def _attempt_key(self, entry: Entry) -> int:
        rest = entry.workload.pods[len(entry.placed) :]
        needed = entry.workload.needed - len(entry.placed)
        key = (needed, tuple(p.key() for p in rest)) if self.gang else (rest[0].key(),)
        return self._key_ids.setdefault(key, len(self._key_ids))

    def _forget_key(self, entry: Entry) -> None:
        keys = self._keys[entry.queue]
        keys[entry.key] -= 1
        if keys[entry.key] <= 0:
            del keys[entry.key]
