"""The controller: informers feed the engine, the engine decides, binders and evictions carry it out.

The pod cache is the truth and the engine a structure derived from it. Every pass reconciles the two:
bound pods the engine does not hold are put where their HAMi annotations say (so a restarted scheduler
rebuilds the cluster's allocation exactly): ours as running workloads of their queues, charged and open to
preemption, others' pinned; pending pods of ours are submitted as workloads (a pod group as one gang); pods
that are gone release what they held. Then one engine cycle, whose placements are bound
concurrently. A failed bind rolls its workload back; the next pass resubmits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine, Set
from dataclasses import dataclass, field

from fairgpu.errors import BindError, KubeError, RequestError
from fairgpu.framework.interfaces import Evict
from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import CycleObserver, CycleResult, Scheduler
from fairgpu.hamiconfig import DEFAULT as DEFAULT_HAMI
from fairgpu.hamiconfig import HamiConfig
from fairgpu.k8s import hami
from fairgpu.k8s.binder import Binder, device_string
from fairgpu.k8s.holdings import Holdings
from fairgpu.k8s.informer import Informer
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.parsed import ParsedNodes, ParsedPods
from fairgpu.k8s.port import NODES, PODS, QUEUES, KubePort
from fairgpu.k8s.queues import QueueEntry, queue_entries
from fairgpu.k8s.reporter import Reporter
from fairgpu.k8s.translate import PodInfo
from fairgpu.k8s.workloads import GANG_ADMITTED, Batch, pending_batches, submit
from fairgpu.model import NodeSpec, QueueTree
from fairgpu.state import Placement

log = logging.getLogger(__name__)
SCHEDULER_NAME = "fairgpu"
# A victim whose eviction was refused (a PodDisruptionBudget's 429) is not chosen again for this long.
REFUSED_BACKOFF = 60.0
CYCLE_SLICE = 0.005  # seconds of engine work between returns to the event loop
FENCE_MARGIN = 0.5  # a Binding is sent only while the lease is held for at least this long
BIND_ATTEMPTS = 3  # binds of a gang member, in the room held for it, before the gang is undone
# What became of a pod whose bind failed.
LANDED, ELSEWHERE, GONE, FAILED = "landed", "bound elsewhere", "gone", "unbound"


@dataclass(slots=True)
class Stats:
    cycles: int = 0
    binds: int = 0
    bind_failures: int = 0
    rollbacks: int = 0
    evictions: int = 0
    rebuilds: int = 0
    bind_latency: list[float] = field(default_factory=list)  # seconds from the pod's arrival to its bind


class Controller:
    def __init__(
        self,
        port: KubePort,
        profile: Profile,
        scheduler_name: str = SCHEDULER_NAME,
        clock: Callable[[], float] = time.time,
        binder: Binder | None = None,
        leadership: LeaderElector | None = None,
        observer: CycleObserver | None = None,
        hami_config: HamiConfig = DEFAULT_HAMI,
    ) -> None:
        self.port = port
        self.hami = hami_config  # resource names and request defaults; the binder's lock expiry
        self.observer = observer  # told of each cycle: metrics, dashboard history
        self.profile = profile
        self.scheduler_name = scheduler_name
        self.clock = clock
        self._node_events: dict[str, asyncio.Event] = {}
        self.binder = binder or Binder(
            port,
            node_changed=self._node_changed,
            node_cache=lambda name: self.nodes.cache.get(f"/{name}"),
            pod_cache=lambda key: self.pods.cache.get(key),
            lock_expiry=hami_config.lock_expiry,
            fence=self._fence,
        )
        self.reporter = Reporter(port, scheduler_name)
        self.stats = Stats()
        self.wake = asyncio.Event()
        self.nodes = Informer(port, NODES, self._node_event)
        self.pods = Informer(port, PODS, self._pod_event)
        self.queues = Informer(port, QUEUES, self._queue_event)
        self.namespaces: dict[str, tuple[str, ...]] = {}  # valid queue → namespaces that may use it
        self.engine: Scheduler | None = None
        self.book: Holdings | None = None  # what the engine holds, pod by pod; one per engine
        self._built_from: tuple | None = None
        self.inflight: set[str] = set()  # pods whose bind is under way
        # Binds that landed (seen by us before the pod cache shows them): their room is kept when the
        # workload is dropped. Failed binds per workload, with what became of the pod (see _outcome).
        self._landed: set[str] = set()
        self._failed: dict[str, dict[str, str]] = {}
        self._attempts: dict[str, int] = {}  # bind attempts per pod, this engine
        self._undoing: set[str] = set()  # gangs whose landed members are being evicted
        self._refusals: list[tuple[str, float]] = []  # (workload, retry at) of refused evictions, to apply
        self.seen_at: dict[str, float] = {}  # when each pending pod was first seen, for latency
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
        self._cycled_at = -1e18
        self.retry_every = 1.0
        self.status_every = 2.0  # seconds between queue status updates
        self._status_at = -1e18
        self._tasks: set[asyncio.Task] = set()
        if leadership is None:  # without an elector this replica always leads
            self.leading = asyncio.Event()
            self.leading.set()
            self.lease_left: Callable[[], float] = lambda: math.inf
        else:
            self.leading = leadership.leading
            self.lease_left = leadership.remaining
            leadership.on_lost.append(self._lost)

    def synced(self) -> bool:
        """Every informer has listed and none has failed since: the caches are warm (on a standby too)."""
        return all(i.synced.is_set() and i.healthy for i in (self.nodes, self.pods, self.queues))

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

    def _changed(self) -> None:
        self._engine_changed = True
        self.wake.set()

    def _drop(self, name: str, pods: dict[str, PodInfo], elsewhere: Set[str] = frozenset()) -> None:
        assert self.book is not None
        self._undoing.discard(name)
        self.book.drop(name, pods, elsewhere)

    def _fence(self) -> None:
        """Raise unless this replica still leads for long enough to send a Binding."""
        if self.lease_left() < FENCE_MARGIN:
            raise BindError("the lease is not held with margin; not binding")

    def _node_event(self, kind: str, obj: dict) -> None:
        event = self._node_events.pop(obj["metadata"]["name"], None)
        if event is not None:
            event.set()
        self._inputs_changed = True
        self.wake.set()

    def _queue_event(self, kind: str, obj: dict) -> None:
        self._inputs_changed = True
        self.wake.set()

    def _node_changed(self, node: str) -> asyncio.Event:
        """An event the node informer sets at this node's next change."""
        return self._node_events.setdefault(node, asyncio.Event())

    def _pod_event(self, kind: str, obj: dict) -> None:
        key = f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
        self._dirty.add(key)
        if kind == "DELETED":
            self.seen_at.pop(key, None)
        elif not (obj.get("spec") or {}).get("nodeName"):
            self.seen_at.setdefault(key, self.clock())
        self.wake.set()

    # -- main loop --------------------------------------------------------------------------------------
    async def run(self, min_interval: float = 0.01) -> None:
        informers = [asyncio.create_task(i.run()) for i in (self.nodes, self.pods, self.queues)]
        try:
            await asyncio.gather(*(i.synced.wait() for i in (self.nodes, self.pods, self.queues)))
            while True:
                if not self.leading.is_set():  # standbys keep their caches warm and decide nothing
                    await self.leading.wait()
                    # A new term: the cache must hold every bind made before it (ours cancelled at the last
                    # loss, or another leader's) before anything is placed; the engine is rebuilt from it.
                    await self.pods.resync()
                    self._built_from = None
                    self.wake.set()
                waiting = self.engine is not None and bool(self.engine.pending)
                with contextlib.suppress(TimeoutError):  # waiting work is retried without news, too
                    await asyncio.wait_for(self.wake.wait(), self.retry_every if waiting else None)
                self.wake.clear()
                if self.leading.is_set():
                    await self.step()
                await asyncio.sleep(min_interval)  # let a burst of events land before the next cycle
        finally:
            for t in informers + list(self._tasks):
                t.cancel()
            await asyncio.gather(*informers, *self._tasks, return_exceptions=True)
            await self.reporter.close()

    async def step(self) -> None:
        """One reconcile + engine cycle; starts the binds and evictions it decides. The cycle runs in slices
        of at most CYCLE_SLICE seconds with the loop free in between, so lease renewal, informers and the
        webhook on the same loop are never held up by a long cycle (the engine is not thread-safe, and with
        the GIL a thread would not free the loop any better). Nothing else changes the engine meanwhile: bind
        and eviction tasks only record their outcomes, and the next pass applies them."""
        now = self.clock()
        self._reconcile(now)
        if self.engine is None:
            return
        if not self._engine_changed and now - self._cycled_at < self.retry_every:
            return
        self._engine_changed, self._cycled_at = False, now
        engine = self.engine
        result = CycleResult()
        started = time.perf_counter()
        slice_end = started + CYCLE_SLICE
        for _ in engine.steps(now, result):
            if time.perf_counter() > slice_end:
                await asyncio.sleep(0)
                slice_end = time.perf_counter() + CYCLE_SLICE
        if engine is not self.engine or not self.leading.is_set():
            return  # the lease was lost meanwhile: nothing of this cycle is carried out
        if self.observer is not None:
            self.observer.on_cycle(engine, result, now, time.perf_counter() - started)
        self.stats.cycles += 1
        decided: dict[str, list[tuple[str, Placement]]] = {}
        for b in result.bound:
            self.inflight.add(b.pod_name)
            decided.setdefault(b.workload, []).append((b.pod_name, b.placement))
        for workload, binds in decided.items():
            self._spawn(self._commit(workload, binds))
        for ev in result.evictions:
            if ev.pods is not None:
                self.shrinking[ev.workload] = ev.pods
            self._spawn(self._evict(ev, math.ceil(ev.grace)))
        self._report(now)

    def _quiet(self) -> bool:
        """No bind under way, and every landed bind shows in the pod cache: the cache alone tells what runs."""
        for key in list(self._landed):
            obj = self.pods.cache.get(key)
            if obj is None or (obj.get("spec") or {}).get("nodeName"):
                self._landed.discard(key)
        return not self.inflight and not self._landed

    def _lost(self) -> None:
        """The lease is gone: no bind or eviction of this term goes on. What they leave behind is read from
        the cluster when this replica leads again."""
        for task in list(self._tasks):
            task.cancel()
        self.inflight.clear()
        self._landed.clear()  # the new term's first list shows them
        self.wake.set()

    def _report(self, now: float) -> None:
        engine = self.engine
        assert engine is not None

        def uid(key: str) -> str | None:
            obj = self.pods.cache.get(key)
            return None if obj is None else obj["metadata"].get("uid", "")

        self.reporter.report_pending(
            engine, lambda name: self.members.get(name, ()), lambda k: k not in self.inflight, uid, now
        )
        if now - self._status_at >= self.status_every:
            self._status_at = now
            self.reporter.report_queues(engine)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reconcile ----------------------------------------------------------------------------------------
    def _queue_entries(self) -> list[QueueEntry]:
        entries, errors = queue_entries(self.queues.cache.values())
        for name, problem in errors.items():
            if self.queue_errors.get(name) != problem:
                self._spawn(self.reporter.queue_invalid(name, problem))
        self.queue_errors = errors
        return entries

    def _reconcile(self, now: float) -> None:
        if self._inputs_changed:
            node_specs = self._nodes.read(self.nodes.cache)
            entries = self._queue_entries()
            try:
                tree = QueueTree([e.spec for e in entries])
            except ValueError as err:
                log.error("queues: %s", err)
                return
            self.namespaces = {e.spec.name: e.namespaces for e in entries}
            shape = (tuple(node_specs), repr(tree.queues))
            if shape != self._built_from:
                if not self._quiet():
                    self.wake.set()  # rebuild once the binds under way have landed and the cache shows them
                    return
                self._rebuild(node_specs, tree, shape)
            self._inputs_changed = False
        engine, book = self.engine, self.book
        assert engine is not None and book is not None
        self._settle()
        parsed = self._pods
        keys = set(self.pods.cache) | set(parsed.infos) | set(parsed.bad) if self._all_dirty else self._dirty
        self._all_dirty, self._dirty = False, set()
        parsed.read(self.pods.cache, keys)
        pods, bad = parsed.infos, parsed.bad
        # Pods that are gone or finished release what they hold.
        for key in keys:
            p = pods.get(key)
            if p is None or p.node:  # the cache is the truth about it again
                self._landed.discard(key)
                self._attempts.pop(key, None)
            gone = p is None or p.terminal
            if gone and key in self.fixed:
                book.unhold(key)
            if gone and key in self.owned:
                name = self.owned[key]
                if name in self._failed or any(k in self.inflight for k in self.members[name]):
                    self._dirty.add(key)  # look again once the workload's binds have finished
                elif not book.shrunk(self.owned[key], pods):
                    self._drop(self.owned[key], pods)
        # Bound pods the engine does not hold: ours run on as workloads (a group's members as one), others'
        # are pinned where they run.
        found: dict[str, list[PodInfo]] = {}
        for key in keys:
            p = pods.get(key)
            if p is not None and p.node and not p.terminal and key not in self.owned and key not in self.fixed:
                if p.scheduler == self.scheduler_name:
                    found.setdefault(f"{p.namespace}/group:{p.group}" if p.group else key, []).append(p)
                else:
                    book.pin(p)
        for name, members in found.items():
            book.adopt(name, members)
        self._submit_pending(keys | self._dirty, pods, bad, now)

    def _rebuild(self, node_specs: list[NodeSpec], tree: QueueTree, shape: tuple) -> None:
        """A new engine for a changed inventory or queue set; every pod is re-derived from the cache."""
        self.engine = Scheduler(node_specs, tree, self.profile)
        self._engine_changed = True
        self._built_from = shape
        self.book = Holdings(
            self.engine,
            lambda: self.namespaces,
            self._is_bound,
            self._changed,
            lambda key: self._dirty.add(key),
            self.reporter.allocation_unreadable,
        )
        self._failed.clear()
        self._undoing.clear()
        self._refusals.clear()
        self._attempts.clear()
        self._all_dirty = True
        self.stats.rebuilds += 1

    def _submit_pending(self, keys: set[str], pods: dict[str, PodInfo], bad: dict[str, str], now: float) -> None:
        for key in keys & bad.keys():
            problem = bad[key]
            obj = self.pods.cache[key]
            if (obj.get("spec") or {}).get("schedulerName") == self.scheduler_name and not obj["spec"].get("nodeName"):
                self.reporter.unschedulable(key, obj["metadata"].get("uid", ""), problem)

        def waiting(p: PodInfo) -> bool:
            if p.scheduler != self.scheduler_name or p.node or p.terminal or p.deleting:
                return False
            return p.key not in self.owned and p.key not in self.inflight

        def unschedulable(p: PodInfo, why: str) -> None:
            self.reporter.unschedulable(p.key, p.uid, why)

        for batch in pending_batches(keys, pods, self._pods.groups, waiting, self.members.__contains__, unschedulable):
            self._submit(batch)

    def _submit(self, batch: Batch) -> None:
        engine, book = self.engine, self.book
        assert engine is not None and book is not None
        why = submit(engine, batch, self.namespaces)
        if why is not None:
            for m in batch.members:
                self.reporter.unschedulable(m.key, m.uid, why)
            return
        book.submitted(batch)

    # -- decisions ----------------------------------------------------------------------------------------
    async def _commit(self, workload: str, binds: list[tuple[str, Placement]]) -> None:
        """Bind a workload's placed pods concurrently. A gang's members are first marked admitted: if this
        scheduler dies with the gang half bound, its successor must place the rest without waiting for
        members that already ran and are gone."""
        if len(self.members.get(workload, ())) > 1:
            try:
                for key in self.members[workload]:
                    info = self._pods.infos.get(key)
                    if info is not None and info.annotations.get(GANG_ADMITTED) == "true":
                        continue  # marked when the gang started; an elastic one's later pods need no second patch
                    ns, name = key.split("/", 1)
                    await self.port.patch(PODS, name, {"metadata": {"annotations": {GANG_ADMITTED: "true"}}}, ns)
            except KubeError as err:
                log.warning("gang %s not marked admitted: %s; rolling back", workload, err)
                for key, _ in binds:
                    self.inflight.discard(key)
                    self._failed.setdefault(workload, {})[key] = FAILED
                self.wake.set()
                return
        await asyncio.gather(*(self._bind(workload, key, placement) for key, placement in binds))

    async def _bind(self, workload: str, key: str, placement: Placement, delay: float = 0.0) -> None:
        """Every decided bind starts at once: the client's connection pool bounds the requests in flight, and
        HAMi's node lock lines up the binds to one node. A cap on binds in flight would be held by binds
        waiting for a node's lock, so one binpacked node's queue would stall binds to every other node.
        A failed bind is resolved before it stops holding its room: the pod is read from the API server
        (its Binding may have landed with the answer lost). What is learnt is recorded; the next pass acts."""
        engine = self.engine
        assert engine is not None
        p = self._pods.infos.get(key) if key in self.pods.cache else None  # parsed at the pass that placed it
        node = engine.state.node_names[placement.node]
        gpus = engine.state.nodes[placement.node].gpus
        devices = [
            hami.DeviceUse(gpus[s].uuid, "NVIDIA", m, placement.cores)
            for s, m in zip(placement.slots, placement.mem_mib, strict=True)
        ]
        self._attempts[key] = self._attempts.get(key, 0) + 1
        try:
            await asyncio.sleep(delay)
            if p is None:
                raise BindError("pod disappeared before its bind")
            await self.binder.bind(p, node, devices)
            self._landed.add(key)
            self.stats.binds += 1
            self.stats.bind_latency.append(self.clock() - self.seen_at.pop(key, self.clock()))
            self.reporter.scheduled(key, p.uid, node)
        except (BindError, KubeError, RequestError) as err:
            self.stats.bind_failures += 1
            outcome = GONE if p is None else await self._outcome(p, node, device_string(p, devices) if devices else "")
            log.warning("bind %s failed (%s): %s", key, outcome, err)
            if outcome == LANDED:
                self._landed.add(key)
                self.stats.binds += 1
            else:
                self._failed.setdefault(workload, {})[key] = outcome
        finally:
            self.inflight.discard(key)
            self.wake.set()

    async def _outcome(self, p: PodInfo, node: str, alloc: str) -> str:
        """Where a pod whose bind failed stands, read from the API server (asked again until it answers):
        LANDED where we bound it, ELSEWHERE bound by someone else's decision, GONE, or FAILED (unbound)."""
        pause = 0.05
        while True:
            try:
                obj = await self.port.get(PODS, p.name, p.namespace)
                break
            except KubeError as err:
                if err.code == 404:
                    return GONE
                await asyncio.sleep(pause)
                pause = min(2.0, pause * 2)
        meta = obj["metadata"]
        if meta.get("uid") != p.uid:
            return GONE  # a new pod of the same name
        where = (obj.get("spec") or {}).get("nodeName")
        if not where:
            return GONE if meta.get("deletionTimestamp") else FAILED
        ours = (meta.get("annotations") or {}).get(hami.ALLOCATED, "") == alloc
        return LANDED if where == node and ours else ELSEWHERE

    def _settle(self) -> None:
        """Act on finished binds and refused evictions. A workload with a failed bind lets go of nothing
        while any bind of it is in flight. Then: a gang some of whose members landed retries the failed
        binds in the room still held for them (a few times), else is undone whole (landed members evicted,
        their room held until they are gone); any other workload is dropped, its landed members running on
        as a workload of their own, the rest resubmitted."""
        engine = self.engine
        assert engine is not None
        for workload, until in self._refusals:
            if workload in self.members:
                engine.eviction_refused(workload, until)
                self.shrinking.pop(workload, None)
                self._engine_changed = True
        self._refusals.clear()
        for name in list(self._failed):
            keys = self.members.get(name)
            if keys is None or name in self._undoing:
                del self._failed[name]
                continue
            if any(k in self.inflight for k in keys):
                continue
            failed = self._failed.pop(name)
            landed = [k for k in keys if self._is_bound(k) and failed.get(k) != ELSEWHERE]
            if landed and name in self.gangs:
                retry = [k for k, why in failed.items() if why == FAILED and self._attempts.get(k, 0) < BIND_ATTEMPTS]
                if len(retry) == len(failed):
                    for k in retry:
                        placement = engine.state.placement(k)
                        assert placement is not None
                        self.inflight.add(k)
                        self._spawn(self._bind(name, k, placement, delay=0.2 * self._attempts[k]))
                    continue
                self.stats.rollbacks += 1
                self._undoing.add(name)
                self._spawn(self._undo_gang(name, keys, landed))
                continue
            self.stats.rollbacks += 1
            self._drop(name, self._pods.infos, {k for k, why in failed.items() if why == ELSEWHERE})

    def _is_bound(self, key: str) -> bool:
        p = self._pods.infos.get(key)
        return key in self._landed or (p is not None and p.node is not None and not p.terminal)

    async def _undo_gang(self, name: str, keys: tuple[str, ...], landed: list[str]) -> None:
        """A gang that cannot be completed: its members lose the admitted mark (so what is left waits for a
        whole gang again), then its landed members are evicted. The engine holds all of its room until they
        are gone; their absence then drops the workload."""
        for key in keys:
            ns, pod = key.split("/", 1)
            with contextlib.suppress(KubeError):  # a member gone already needs no unmarking
                await self.port.patch(PODS, pod, {"metadata": {"annotations": {GANG_ADMITTED: None}}}, ns)
        for key in landed:
            p = self._pods.infos.get(key)
            ns, pod = key.split("/", 1)
            try:
                await self.port.evict(ns, pod, None, p.uid if p is not None else None)
                self.reporter.preempted(key, f"gang {name} could not be bound whole and was rolled back")
            except KubeError as err:
                if err.code not in (404, 409):  # 409: the UID precondition, a new pod of that name
                    log.warning("rolling back gang %s: %s stays: %s", name, key, err)

    async def _evict(self, ev: Evict, grace: int) -> None:
        """Evict a victim through the Eviction API with its queue's grace period and the pod's UID as a
        precondition (a new pod of the same name is never the victim): every pod of a whole workload, only
        the named extra pods of an elastic one. A refusal (a PodDisruptionBudget's 429, or any failure but
        the pod being gone already) stops there: the victim keeps running, out of choice for REFUSED_BACKOFF
        seconds, and its preemptor picks another victim at its next attempt."""
        keys = self.members.get(ev.workload, ())
        if ev.pods is not None:
            keys = tuple(keys[i] for i in ev.pods)
        for key in keys:
            ns, name = key.split("/", 1)
            p = self._pods.infos.get(key)
            try:
                await self.port.evict(ns, name, grace, p.uid if p is not None else None)
            except KubeError as err:
                if err.code == 404:
                    continue  # gone already: what an eviction wants
                log.info("eviction of %s refused: %s", key, err)
                self._refusals.append((ev.workload, self.clock() + REFUSED_BACKOFF))
                break
            self.stats.evictions += 1
            self.reporter.preempted(key, ev.reason)
        self.wake.set()
