"""What the engine holds, pod by pod: our workloads (their member pods, which are gangs, which are shrinking)
and others' pods pinned where they run. One Holdings lives as long as its engine; every change to what the
engine holds goes through it, so the two never disagree."""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Set as AbstractSet

from fairgpu.errors import RequestError, StateError
from fairgpu.framework.scheduler import Scheduler
from fairgpu.k8s.queues import QueueMap
from fairgpu.k8s.records import hold, holdings
from fairgpu.k8s.translate import PodInfo
from fairgpu.k8s.workloads import Batch, queue_for, workload_of
from fairgpu.state import Placement

log = logging.getLogger(__name__)


class Holdings:
    def __init__(
        self,
        engine: Scheduler,
        queues: Callable[[], QueueMap],
        is_bound: Callable[[str], bool],
        changed: Callable[[], None],
        recheck: Callable[[str], None],
        unreadable: Callable[[str, str, str], None] = lambda key, uid, message: None,
    ) -> None:
        self.engine = engine
        self.queues = queues  # which queue serves a pod
        self.is_bound = is_bound  # the pod runs, or our bind of it landed (even if the cache lags)
        self.changed = changed  # the engine's inputs changed: cycle again
        self.recheck = recheck  # look at this pod again at the next pass
        self.unreadable = unreadable  # (pod key, uid, why): a pinned pod not fully accounted, said on the pod
        self.fixed: dict[str, list[str]] = {}  # others' pods (and ours without a queue) pinned: their ledger keys
        self.unaccounted: dict[str, str] = {}  # pinned pods whose HAMi record could not be read or did not fit
        self.owned: dict[str, str] = {}  # pod key → engine workload holding it
        self.members: dict[str, tuple[str, ...]] = {}  # engine workload → its pod keys
        self.gangs: set[str] = set()  # workloads of several pods that run whole or not at all
        self.shrinking: dict[str, tuple[int, ...]] = {}  # elastic workload → its pods being evicted
        # UID of each pod held (owned or fixed): a pod deleted and made again under its name (a StatefulSet's,
        # a Job's retry) between two passes is another pod; the one held is gone.
        self.uids: dict[str, str] = {}

    def replaced(self, p: PodInfo) -> bool:
        """The pod of this name is not the one held: the held one is gone."""
        held = self.uids.get(p.key)
        return held is not None and held != p.uid

    def submitted(self, batch: Batch) -> None:
        """The engine took this batch as a workload."""
        self.changed()
        self.members[batch.name] = tuple(m.key for m in batch.members)
        if len(batch.members) > 1 and batch.min_pods is None:
            self.gangs.add(batch.name)
        for m in batch.members:
            self.owned[m.key] = batch.name
            self.uids[m.key] = m.uid

    def pin(self, p: PodInfo) -> None:
        """Another scheduler's pod takes its room where it runs, charged to nobody."""
        assert p.node is not None
        ni = self.engine.state.node_index.get(p.node)
        if ni is not None:
            self.fix(p, *holdings(p, self.engine.state, ni))

    def found_placement(self, p: PodInfo) -> Placement | None:
        """Where a bound pod runs as one Placement the engine can adopt; None off our inventory, or when its
        HAMi record has another shape (then it is pinned, every card it names accounted)."""
        engine = self.engine
        assert p.node is not None
        ni = engine.state.node_index.get(p.node)
        found, problem = holdings(p, engine.state, ni) if ni is not None else ([], None)
        if len(found) == 1 and problem is None:
            return found[0]
        if found:
            self.fix(p, found, problem)
        return None

    def fix(self, p: PodInfo, placements: list[Placement], problem: str | None = None) -> None:
        """Hold what a pod holds, every entry of its record (hold); what cannot be read or does not fit is an
        Event on the pod and counts in fairgpu_hami_unaccounted_pods, never ignored."""
        keys, over = hold(self.engine.state, p.key, placements)
        problems = ([problem] if problem else []) + over
        if problems:
            message = "; ".join(problems)
            log.warning("pod %s on %s: %s", p.key, p.node, message)
            self.unaccounted[p.key] = message
            self.unreadable(p.key, p.uid, message)
        self.changed()
        self.fixed[p.key] = keys
        self.uids[p.key] = p.uid

    def adopt(self, name: str, members: list[PodInfo], placements: list[Placement] | None = None) -> None:
        """Our pods found running (after a restart, a rebuild of the engine, or a gang member's exit) run on as
        a workload of their queue: charged to it, and victims for reclaim and fair-share preemption like any
        it placed. A group's running members are one workload, so they are evicted together. Without a queue
        they are pinned, charged to nobody."""
        engine = self.engine
        if placements is None:
            found = [(m, self.found_placement(m)) for m in members]
            members = [m for m, pl in found if pl is not None]
            placements = [pl for _, pl in found if pl is not None]
            if not members:
                return
        if name in self.members:
            name = f"{name}/{members[0].name}"
        queue, _ = queue_for(members[0], self.queues())
        wl = workload_of(name, queue or "", members)
        try:
            engine.adopt(wl, placements, started=min(m.started for m in members))
        except (RequestError, StateError) as err:  # no queue for them (any more), or not all of them fit
            log.warning("pods of %s pinned where they run, charged to no queue: %s", name, err)
            for m, placement in zip(members, placements, strict=True):
                self.fix(m, [placement])
            return
        self.changed()
        self.members[name] = wl.pod_names
        for m in members:
            self.owned[m.key] = name
            self.uids[m.key] = m.uid

    def unhold(self, key: str) -> None:
        for k in self.fixed.pop(key):
            self.engine.state.release(k)
        self.unaccounted.pop(key, None)
        self.uids.pop(key, None)
        self.changed()

    def shrunk(self, name: str, pods: dict[str, PodInfo]) -> bool:
        """An elastic workload whose only missing pods are the ones being evicted from it keeps running with
        the rest; once all of those are gone it shrinks for good (replacements come as new pods). False:
        some other member went, and the workload is dropped."""
        evicted = self.shrinking.get(name)
        if evicted is None:
            return False
        keys = self.members[name]
        gone = {i for i, key in enumerate(keys) if (p := pods.get(key)) is None or p.terminal}
        if not gone <= set(evicted):
            return False
        if gone == set(evicted):
            engine = self.engine
            assert engine is not None
            del self.shrinking[name]
            try:
                engine.shrink(name, evicted, regrow=False)
            except ValueError as err:  # not its newest pods after all: account for it the general way
                log.warning("%s", err)
                return False
            for i in evicted:
                self.owned.pop(keys[i], None)
                self.uids.pop(keys[i], None)
            self.members[name] = tuple(k for i, k in enumerate(keys) if i not in gone)
            self.changed()
        return True

    def drop(
        self,
        name: str,
        pods: dict[str, PodInfo],
        elsewhere: AbstractSet[str] = frozenset(),
        finished_at: float | None = None,
    ) -> None:
        """Take a workload out of the engine; members that run (or whose bind landed, even if the cache has
        not shown it yet) stay on as a workload of their own where we put them, pending ones get resubmitted.
        Members bound `elsewhere` than we decided are found at the next pass and accounted where they run.
        `finished_at`: it completed then (Scheduler.remove)."""
        engine = self.engine
        keys = self.members.pop(name, ())
        self.shrinking.pop(name, None)
        self.gangs.discard(name)
        released = engine.remove(name, finished_at)
        self.changed()
        for key in keys:
            self.owned.pop(key, None)
            self.uids.pop(key, None)
            self.recheck(key)  # pending members are resubmitted on the next pass
        running = [
            (p, placement)
            for key, placement in zip(keys, released, strict=False)
            if (p := pods.get(key)) is not None and key not in elsewhere and self.is_bound(key)
        ]
        if running:
            self.adopt(name, [p for p, _ in running], [placement for _, placement in running])
