"""The engine: pending workloads per queue, and the scheduling cycle that drives the plugins.

Pure and synchronous: drivers (the simulator, the Kubernetes controller) call submit/remove/cycle with
timestamps and carry out the decisions `cycle` returns.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from fairgpu import fairness
from fairgpu import resources as r
from fairgpu.framework.interfaces import Bound, Candidate, EngineView, Evict, FitMask
from fairgpu.framework.profile import Profile
from fairgpu.model.node import NodeSpec
from fairgpu.model.pod import PodSpec, RequestError, Workload
from fairgpu.model.queue import QueueTree
from fairgpu.state import ClusterState, Placement


@dataclass(slots=True)
class _Entry:
    workload: Workload
    queue: int
    seq: int
    charge: np.ndarray  # the whole workload's fair vector
    placed: list[Placement] = field(default_factory=list)
    key: tuple = ()  # what must fit next: failures are cached by it within a cycle

    def sort_key(self) -> tuple[float, float, int]:
        return (-self.workload.priority, self.workload.submit_time, self.seq)

    def __lt__(self, other: _Entry) -> bool:
        return self.sort_key() < other.sort_key()


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
        self.profile = profile
        self.gang = bool(profile.permit)
        q, dims = len(tree), len(r.FAIR_DIMS)
        capacity = self.state.capacity_vector()
        self.view = EngineView(
            state=self.state,
            tree=tree,
            capacity=capacity,
            usage=np.zeros((q, dims)),
            demand=np.zeros((q, dims)),
            entitled=np.zeros((q, dims)),
            usage_dom=np.zeros(q),
            entitled_dom=np.zeros(q),
        )
        self._mean_mem = self.state.mean_gpu_memory_mib()
        self._heaps: list[list[_Entry]] = [[] for _ in range(q)]
        self._keys: list[Counter[tuple]] = [Counter() for _ in range(q)]
        self._pending: dict[str, _Entry] = {}
        self._running: dict[str, _Entry] = {}
        self._charges: dict[PodSpec, np.ndarray] = {}
        self._seq = 0

    # -- events from the driver ---------------------------------------------------------------------
    def submit(self, wl: Workload) -> None:
        """Queue a workload. Raises RequestError (nothing changed) if it can never be placed."""
        if wl.name in self._pending or wl.name in self._running:
            raise RequestError(f"workload {wl.name}: already submitted")
        qi = self.tree.index.get(wl.queue)
        if qi is None:
            raise RequestError(f"workload {wl.name}: queue {wl.queue!r} does not exist")
        if not self.tree.is_leaf[qi]:
            raise RequestError(f"workload {wl.name}: queue {wl.queue!r} has child queues; submit to a leaf")
        for pod in wl.pods:
            self.check_placeable(pod, f"workload {wl.name}")
        charge = sum((self._charge(p) for p in wl.pods), r.zeros())
        entry = _Entry(wl, qi, self._seq, charge)
        self._seq += 1
        entry.key = self._attempt_key(entry)
        self._pending[wl.name] = entry
        heapq.heappush(self._heaps[qi], entry)
        self._keys[qi][entry.key] += 1
        self.view.demand[qi] += charge

    def remove(self, name: str) -> list[Placement]:
        """A workload finished or was deleted: release whatever it holds. Returns the released placements."""
        entry = self._running.pop(name, None)
        if entry is None:
            entry = self._pending.pop(name, None)
            if entry is None:
                raise KeyError(name)
            self._heaps[entry.queue].remove(entry)
            heapq.heapify(self._heaps[entry.queue])
            self._forget_key(entry)
        released = [self._release(entry, i) for i in range(len(entry.placed))]
        entry.placed.clear()
        self.view.demand[entry.queue] -= entry.charge
        return released

    # -- queries ------------------------------------------------------------------------------------
    def pending_names(self) -> list[str]:
        return list(self._pending)

    def running_names(self) -> list[str]:
        return list(self._running)

    def is_backlogged(self) -> np.ndarray:
        """(Q,) whether each queue has pending workloads."""
        return np.array([bool(h) for h in self._heaps], dtype=bool)

    def pending_count(self, queue: int) -> int:
        return len(self._heaps[queue])

    def refresh_shares(self) -> None:
        v = self.view
        v.entitled = fairness.entitlements(self.tree, v.capacity, v.demand)
        v.entitled_dom = fairness.dominant_shares(v.entitled, v.capacity)
        v.usage_dom = fairness.dominant_shares(v.usage, v.capacity)

    def check_placeable(self, pod: PodSpec, where: str) -> None:
        """Raise RequestError if no node of this cluster could ever hold the pod, even when empty."""
        problem = self.state.unplaceable_reason(pod)
        if problem:
            raise RequestError(f"{where}: {problem}")

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
        self.refresh_shares()
        failed: set[tuple] = set()  # shapes that did not fit: capacity only shrinks within a cycle
        refused: list[set[tuple]] = [set() for _ in self._heaps]  # per queue, by admission
        skipped: dict[int, list[_Entry]] = {}
        active = [q for q, h in enumerate(self._heaps) if h]
        try:
            while active:
                candidates = [Candidate(q, self._heaps[q][0].workload, self._heaps[q][0].seq) for q in active]
                q = candidates[self.profile.queue_sort.pick(candidates, self.view)].queue
                entry = heapq.heappop(self._heaps[q])
                if entry.key in failed or entry.key in refused[q]:
                    skipped.setdefault(q, []).append(entry)
                elif (reason := self._admit(entry)) is not None:
                    refused[q].add(entry.key)
                    skipped.setdefault(q, []).append(entry)
                elif self._try_place(entry, result):
                    self._start(entry, result)
                else:
                    failed.add(entry.key)
                    skipped.setdefault(q, []).append(entry)
                    for plugin in self.profile.preempt:
                        reason = f"preempted so that {entry.workload.name} fits"
                        victims = plugin.preempt(entry.workload, q, self.view)
                        result.evictions.extend(Evict(v, reason) for v in victims)
                if not self._heaps[q] or all(k in failed or k in refused[q] for k in self._keys[q]):
                    active.remove(q)
                result.attempts += 1
                yield
        finally:
            for q, entries in skipped.items():
                for entry in entries:
                    heapq.heappush(self._heaps[q], entry)

    def _admit(self, entry: _Entry) -> str | None:
        remaining = entry.charge - sum((self._charge(p) for p in self._placed_pods(entry)), r.zeros())
        for plugin in self.profile.admit:
            reason = plugin.admit(entry.workload, entry.queue, remaining, self.view)
            if reason is not None:
                return reason
        return None

    def _try_place(self, entry: _Entry, result: CycleResult) -> bool:
        wl = entry.workload
        first_new = len(entry.placed)
        for i in range(first_new, len(wl.pods)):
            placement = self._place_pod(wl.pods[i])
            if placement is None:
                break
            self.state.assign(wl.pod_names[i], placement)
            entry.placed.append(placement)
            self._account(entry.queue, wl.pods[i], +1)
        if len(entry.placed) < len(wl.pods) and any(
            not p.permit(wl, len(entry.placed)) for p in self.profile.permit
        ):
            while len(entry.placed) > first_new:
                self._release(entry, len(entry.placed) - 1)
                entry.placed.pop()
            return False
        for i in range(first_new, len(entry.placed)):
            result.bound.append(Bound(wl.name, i, wl.pod_names[i], entry.placed[i]))
        if len(entry.placed) < len(wl.pods):
            self._forget_key(entry)
            entry.key = self._attempt_key(entry)
            self._keys[entry.queue][entry.key] += 1
            return False
        return True

    def _place_pod(self, pod: PodSpec) -> Placement | None:
        """Filter and score one pod against every node at once; None if no node fits."""
        view, st = self.view, self.state
        mask = FitMask(nodes=np.ones(st.num_nodes, dtype=bool))
        for f in self.profile.filter:
            f.filter(pod, view, mask)
        if not mask.nodes.any():
            return None
        total = np.zeros(st.num_nodes)
        for plugin, weight in self.profile.score:
            total += weight * plugin.score(pod, view, mask)
        node = int(np.argmax(np.where(mask.nodes, total, -np.inf)))
        if pod.gpu is None:
            return st.placement_for(pod, node, ())
        slots = np.flatnonzero(mask.slots[node])
        if self.profile.score:
            slots = self.profile.score[0][0].gpu_order(pod, view, node, slots)
        return st.placement_for(pod, node, slots[: pod.gpu.count])

    def _start(self, entry: _Entry, result: CycleResult) -> None:
        del self._pending[entry.workload.name]
        self._forget_key(entry)
        self._running[entry.workload.name] = entry
        result.started.append(entry.workload.name)

    # -- bookkeeping --------------------------------------------------------------------------------
    def _charge(self, pod: PodSpec) -> np.ndarray:
        c = self._charges.get(pod)
        if c is None:
            c = self._charges[pod] = pod.charge(self._mean_mem)
        return c

    def _placed_pods(self, entry: _Entry) -> tuple[PodSpec, ...]:
        return entry.workload.pods[: len(entry.placed)]

    def _account(self, q: int, pod: PodSpec, sign: int) -> None:
        v = self.view
        charge = self._charge(pod)
        while q >= 0:
            v.usage[q] += sign * charge
            v.usage_dom[q] = fairness.dominant_shares(v.usage[q], v.capacity)
            q = int(self.tree.parent[q])

    def _release(self, entry: _Entry, i: int) -> Placement:
        wl = entry.workload
        placement = self.state.release(wl.pod_names[i])
        self._account(entry.queue, wl.pods[i], -1)
        return placement

    def _attempt_key(self, entry: _Entry) -> tuple:
        rest = entry.workload.pods[len(entry.placed) :]
        return tuple(p.key() for p in rest) if self.gang else (rest[0].key(),)

    def _forget_key(self, entry: _Entry) -> None:
        keys = self._keys[entry.queue]
        keys[entry.key] -= 1
        if keys[entry.key] <= 0:
            del keys[entry.key]
