"""Reconcile: the pod cache is the truth and the engine a structure derived from it (k8s/controller.py).

Every pass brings the two together: bound pods the engine does not hold are put where their HAMi annotations
say (so a restarted scheduler rebuilds the cluster's allocation exactly): ours as running workloads of their
queues, charged and open to preemption, others' pinned; pending pods of ours are submitted as workloads (a
pod group as one gang); pods that are gone release what they held. A changed inventory or queue set builds a
new engine. The controller's loop, term and carrying out live in controller.py, which mixes this in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from fairgpu.framework.profile import Profile
from fairgpu.framework.reconfigure import successor
from fairgpu.framework.scheduler import Scheduler
from fairgpu.hamiconfig import HamiConfig
from fairgpu.k8s.carryout import CarryOut, Stats
from fairgpu.k8s.holdings import Holdings
from fairgpu.k8s.identity import UNATTRIBUTED
from fairgpu.k8s.informer import Informer
from fairgpu.k8s.parsed import ParsedNodes, ParsedPods
from fairgpu.k8s.queues import QueueEntry, queue_entries, queue_map
from fairgpu.k8s.reporter import Reporter
from fairgpu.k8s.translate import PodInfo
from fairgpu.k8s.workloads import Batch, by_workload, pending_batches, submit
from fairgpu.model import NodeSpec, QueueTree

log = logging.getLogger(__name__)


class Reconciler:
    """The engine and what it holds, derived from the caches; mixed into the Controller, which owns these:"""

    pods: Informer
    nodes: Informer
    queues: Informer
    carry: CarryOut
    reporter: Reporter
    stats: Stats
    profile: Profile
    scheduler_name: str
    clock: Callable[[], float]
    wake: asyncio.Event

    def __init__(self, hami_config: HamiConfig) -> None:
        self.queue_map = queue_map(())  # which valid queue serves a pod
        self.engine: Scheduler | None = None
        self.book: Holdings | None = None  # what the engine holds, pod by pod; one per engine
        self._built_from: tuple | None = None
        self.queue_errors: dict[str, str] = {}
        # Pods changed since the last pass: a pass looks only at these, so its cost follows the events,
        # not the cluster's size. A rebuild looks at every pod again.
        self._dirty: set[str] = set()
        self._all_dirty = True
        self._pods = ParsedPods(hami_config.rules())
        self._nodes = ParsedNodes(self.reporter.gpus_refused)
        # Nodes or queues changed since the last pass: only then are they read again (a bind's node lock
        # changes a node twice, and reading 5,000 nodes at every pass would cost more than the binds).
        self._inputs_changed = True
        # The engine's inputs (workloads, what runs, capacity) changed since its last cycle. Without a change
        # a cycle could only repeat the last one's decisions, so it runs only every `retry_every` seconds
        # while work waits (reservations expire, workloads starve, gang timeouts pass).
        self._engine_changed = True

    # What the engine holds, for readers (tests, the dashboard): empty before the first engine.
    @property
    def owned(self) -> dict[str, str]:
        return self.book.owned if self.book is not None else {}

    @property
    def fixed(self) -> dict[str, list[str]]:
        return self.book.fixed if self.book is not None else {}

    @property
    def unaccounted(self) -> dict[str, str]:
        return self.book.unaccounted if self.book is not None else {}

    @property
    def members(self) -> dict[str, tuple[str, ...]]:
        return self.book.members if self.book is not None else {}

    @property
    def gangs(self) -> set[str]:
        return self.book.gangs if self.book is not None else set()

    @property
    def shrinking(self) -> dict[str, tuple[int, ...]]:
        return self.book.shrinking if self.book is not None else {}

    @property
    def inflight(self) -> set[str]:
        """Pods whose bind is under way."""
        return self.carry.inflight

    def _changed(self) -> None:
        self._engine_changed = True
        self.wake.set()

    def _queue_entries(self) -> list[QueueEntry]:
        entries, errors = queue_entries(self.queues.cache.values())
        for name, problem in errors.items():
            if self.queue_errors.get(name) != problem:
                self.carry.spawn(self.reporter.queue_invalid(name, problem))
        self.queue_errors = errors
        return entries

    def _queue_uid(self, name: str) -> str:
        return (self.queues.cache.get(f"/{name}") or {"metadata": {}})["metadata"].get("uid", "")

    def _reconcile(self, now: float) -> None:
        if self._inputs_changed:
            node_specs = self._nodes.read(self.nodes.cache)
            entries = self._queue_entries()
            try:
                tree = QueueTree([e.spec for e in entries])
            except ValueError as err:
                log.error("queues: %s", err)
                return
            self.queue_map = queue_map(entries)
            self.reporter.queues_shadowed(self.queue_map, self._queue_uid)
            shape = (tuple(node_specs), repr(tree.queues))
            if shape != self._built_from:
                if not self.carry.quiet():
                    self.wake.set()  # rebuild once the binds under way have landed and the cache shows them
                    return
                self._rebuild(node_specs, tree, shape, now)
            self._inputs_changed = False
        engine, book = self.engine, self.book
        assert engine is not None and book is not None
        if self.carry.settle():
            self._engine_changed = True
        parsed = self._pods
        keys = set(self.pods.cache) | set(parsed.infos) | set(parsed.bad) if self._all_dirty else self._dirty
        self._all_dirty, self._dirty = False, set()
        parsed.read(self.pods.cache, keys)
        pods, bad = parsed.infos, parsed.bad
        # Pods that are gone or finished release what they hold.
        for key in keys:
            p = pods.get(key)
            if p is None or p.node:  # the cache is the truth about it again
                self.carry.seen(key)
            gone = p is None or p.terminal or book.replaced(p)
            if gone and key in self.fixed:
                book.unhold(key)
            if gone and key in self.owned:
                name = self.owned[key]
                if self.carry.resolving(name):
                    self._dirty.add(key)  # look again once the workload's binds have finished
                elif not book.shrunk(name, pods):
                    # A member that succeeded ends the run: its length teaches the queue's duration estimate.
                    done = self.clock() if p is not None and p.phase == "Succeeded" else None
                    self.carry.drop(name, pods, finished_at=done)
        # Bound pods the engine does not hold: ours run on as workloads (a group's members as one), others'
        # are pinned where they run.
        ours: list[PodInfo] = []
        for key in keys:
            p = pods.get(key)
            if p is not None and p.node and not p.terminal and key not in self.owned and key not in self.fixed:
                if p.scheduler == self.scheduler_name:
                    ours.append(p)
                else:
                    book.pin(p)
        for (name, _), members in by_workload(ours).items():
            book.adopt(name, members)
        self._submit_pending(keys | self._dirty, pods, bad, now)

    def _rebuild(self, node_specs: list[NodeSpec], tree: QueueTree, shape: tuple, now: float) -> None:
        """A new engine for a changed inventory or queue set, keeping the old one's per-queue memory (decayed
        usage, learned run times: framework/reconfigure.py, as the simulator replays such a change); every
        pod is re-derived from the cache."""
        old = self.engine
        self.engine = (
            Scheduler(node_specs, tree, self.profile) if old is None else successor(old, node_specs, tree, now)
        )
        self._engine_changed = True
        self._built_from = shape
        self.book = Holdings(
            self.engine,
            lambda: self.queue_map,
            self.carry.is_bound,
            self._changed,
            lambda key: self._dirty.add(key),
            self.reporter.allocation_unreadable,
        )
        self.carry.reset(self.engine, self.book)
        self._all_dirty = True
        self.stats.rebuilds += 1

    def _submit_pending(self, keys: set[str], pods: dict[str, PodInfo], bad: dict[str, str], now: float) -> None:
        for key in keys & bad.keys():
            problem = bad[key]
            obj = self.pods.cache[key]
            if (obj.get("spec") or {}).get("schedulerName") == self.scheduler_name and not obj["spec"].get("nodeName"):
                self.reporter.unschedulable(key, obj["metadata"].get("uid", ""), problem)

        def waiting(p: PodInfo) -> bool:
            # A gated pod waits for its gates to go, as kube-scheduler's PreEnqueue has it wait: its Binding would
            # be refused, after its room was booked (and victims perhaps evicted for it) at every pass.
            if p.scheduler != self.scheduler_name or p.node or p.terminal or p.deleting or p.gated:
                return False
            if UNATTRIBUTED in p.annotations:  # charged to no one (webhook.stamp): it waits, and says why
                meta = self.pods.cache[p.key]["metadata"]
                refs = [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict) and r.get("controller")]
                self.reporter.unattributed(p.key, p.uid, refs[0] if refs else {})
                return False
            return p.key not in self.owned and p.key not in self.inflight

        def unschedulable(p: PodInfo, why: str) -> None:
            self.reporter.unschedulable(p.key, p.uid, why)

        for batch in pending_batches(keys, pods, self._pods.groups, waiting, self.members.__contains__, unschedulable):
            self._submit(batch)

    def _submit(self, batch: Batch) -> None:
        engine, book = self.engine, self.book
        assert engine is not None and book is not None
        why = submit(engine, batch, self.queue_map)
        if why is not None:
            for m in batch.members:
                self.reporter.unschedulable(m.key, m.uid, why)
            return
        book.submitted(batch)
