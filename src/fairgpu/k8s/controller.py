"""The controller: informers feed the engine, the engine decides, binders and evictions carry it out.

The pod cache is the truth and the engine a structure derived from it. Every pass reconciles the two
(k8s/reconcile.py), then runs one engine cycle, whose placements are bound concurrently
(k8s/carryout.py). A failed bind rolls its workload back; the next pass resubmits it. Only a leader in the
term its engine was rebuilt for decides; standbys keep their caches warm.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Iterator

from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import CycleObserver, CycleResult
from fairgpu.hamiconfig import DEFAULT as DEFAULT_HAMI
from fairgpu.hamiconfig import HamiConfig
from fairgpu.k8s.binder import Binder
from fairgpu.k8s.carryout import CarryOut, Stats
from fairgpu.k8s.heartbeat import Heartbeat
from fairgpu.k8s.informer import Informer
from fairgpu.k8s.leader import Leadership
from fairgpu.k8s.port import NODES, PODS, QUEUES, KubePort
from fairgpu.k8s.reconcile import Reconciler
from fairgpu.k8s.reporter import Reporter
from fairgpu.k8s.writes import Writes

SCHEDULER_NAME = "fairgpu"
CYCLE_SLICE = 0.005  # seconds of engine work between returns to the event loop
# Seconds of explaining pending workloads per pass; those not reached are explained at the next passes. Each
# explanation replays the queue ahead of it: a thousand at once held the loop for tens of seconds.
REPORT_BUDGET = 0.1
RESYNC_LIMIT = 60.0  # seconds a new term's fresh list may take before the loop counts as hung (see _beating)


class Controller(Reconciler):
    def __init__(
        self,
        port: KubePort,
        profile: Profile,
        scheduler_name: str = SCHEDULER_NAME,
        clock: Callable[[], float] = time.time,
        leadership: Leadership | None = None,
        observer: CycleObserver | None = None,
        hami_config: HamiConfig = DEFAULT_HAMI,
        heartbeat: Heartbeat | None = None,
        writes: Writes | None = None,
    ) -> None:
        self.port = port
        self.hami = hami_config  # resource names and request defaults; the binder's lock expiry
        self.observer = observer  # told of each cycle: metrics, dashboard history
        self.profile = profile
        self.scheduler_name = scheduler_name
        self.clock = clock
        self._node_events: dict[str, asyncio.Event] = {}
        self.reporter = Reporter(port, scheduler_name, pod_cache=lambda key: self.pods.cache.get(key))
        self.stats = Stats()
        self.wake = asyncio.Event()
        self.nodes = Informer(port, NODES, self._node_event)
        self.pods = Informer(port, PODS, self._pod_event)
        self.queues = Informer(port, QUEUES, self._queue_event)
        self.seen_at: dict[str, float] = {}  # when each pending pod was first seen, for latency
        Reconciler.__init__(self, hami_config)
        self._cycled_at = -1e18
        self.retry_every = 1.0
        self.status_every = 2.0  # seconds between queue status updates
        self._status_at = -1e18
        # Stamped at every pass (and every slice of a cycle): the elector given the same one keeps the lease
        # only while the loop moves, and /healthz fails when it stops (heartbeat.py).
        self.heartbeat = heartbeat or Heartbeat()
        self._stopping = False  # a graceful stop has begun: no write of a decision is sent any more (replica.py)
        # The writes carrying out decisions on the wire; the elector given the same one reads it (writes.py).
        self.writes = writes or Writes()
        if leadership is None:  # without an elector this replica always leads
            self.leading = asyncio.Event()
            self.leading.set()
            self._lease: Callable[[], float] = lambda: math.inf
            self.term: Callable[[], int] = lambda: 0
        else:
            self.leading = leadership.leading
            self._lease = leadership.remaining
            self.term = lambda: leadership.term
            leadership.on_lost.append(self._lost)
        self._term = 0  # the term this replica's engine and decisions belong to
        self.carry = CarryOut(
            port,
            self.reporter,
            self._pods,
            lambda key: self.pods.cache.get(key),
            lambda: self.lease_left(),
            self.wake.set,
            self.stats,
            self.seen_at,
            self.writes,
            clock,
        )
        # the only binder: it is wired to this controller's fence and write count, so none binds unfenced
        self.binder = self.carry.binder = Binder(
            port,
            node_changed=self._node_changed,
            node_cache=lambda name: self.nodes.cache.get(f"/{name}"),
            pod_cache=lambda key: self.pods.cache.get(key),
            lock_expiry=hami_config.lock_expiry,
            fence=self.carry.fence,
            abandoned=self._abandoned,
            writes=self.writes,
        )

    def lease_left(self) -> float:
        """Seconds this replica may still carry out decisions for (the fence: carryout.CarryOut.fence); 0 once
        it stops."""
        return 0.0 if self._stopping else self._lease()

    def stop_binding(self) -> None:
        """The first step of a graceful stop: from now on no Binding, Eviction or other write of a decision
        passes the fence."""
        self._stopping = True

    async def drained(self, timeout: float) -> bool:
        """After stop_binding: wait until no write of a decision is on the wire (each answered or given up), at
        most `timeout` seconds. True if none is."""
        end = time.monotonic() + timeout
        while self.writes.sending and time.monotonic() < end:
            await asyncio.sleep(0.01)
        return not self.writes.sending

    def _abandoned(self, obj: dict, node: str) -> bool:
        """An unbound pod of ours that nothing of this term is binding to `node` (binder.Binder.abandoned)."""
        if (obj.get("spec") or {}).get("schedulerName") != self.scheduler_name or not self.leading.is_set():
            return False
        meta = obj["metadata"]
        return not self.carry.busy(f"{meta.get('namespace', '')}/{meta['name']}", node)

    def synced(self) -> bool:
        """Every informer has listed and none has failed since: the caches are warm (on a standby too)."""
        return all(i.synced.is_set() and i.healthy for i in (self.nodes, self.pods, self.queues))

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
                self.heartbeat.beat()
                if not self._in_term():  # standbys keep their caches warm and decide nothing
                    while not self.leading.is_set():  # alive meanwhile: a hung standby must not take over
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(self.heartbeat.every):
                                await self.leading.wait()
                        self.heartbeat.beat()
                    self._term = self.term()
                    # A new term: the cache must hold every bind made before it (ours cancelled at the last
                    # loss, or another leader's) before anything is placed; the engine is rebuilt from it.
                    await self._beating(self.pods.resync(), RESYNC_LIMIT)
                    # A rebuild is decided where inputs changed: without both marks a term that began with no
                    # node or queue news kept the last term's engine, whose workloads with binds cancelled at
                    # the loss stayed booked as running (never bound); flapping leaders piled them up until
                    # nothing fit.
                    self._built_from, self._inputs_changed = None, True
                    self.wake.set()
                waiting = self.engine is not None and bool(self.engine.pending)
                # Waiting work is retried without news, too, and an idle loop passes every heartbeat interval
                # (an idle cluster keeps its leader). asyncio.timeout, not wait_for: in Python 3.11 wait_for
                # loses a cancellation that meets the wake, and a stopped controller ran on.
                every = self.heartbeat.every
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self.retry_every, every) if waiting else every):
                        await self.wake.wait()
                self.heartbeat.beat()
                if not waiting and not self.wake.is_set():
                    continue  # an idle pass: nothing to do but show the loop moves
                self.wake.clear()
                if self._in_term():
                    await self.step()
                await asyncio.sleep(min_interval)  # let a burst of events land before the next cycle
        finally:
            for t in informers:
                t.cancel()
            await asyncio.gather(*informers, return_exceptions=True)
            await self.carry.close()
            await self.reporter.close()

    async def step(self) -> None:
        """One reconcile + engine cycle; starts the binds and evictions it decides. The cycle runs in slices
        of at most CYCLE_SLICE seconds with the loop free in between, so informers and binds on the same loop
        are not held up by a long cycle (the lease is renewed on a thread of its own: leader.py). Nothing else
        changes the engine meanwhile: bind and eviction tasks only record their outcomes, and the next pass
        applies them."""
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
        await _in_slices(engine.steps(now, result), math.inf, self.heartbeat.beat)
        if engine is not self.engine or not self._in_term():
            return  # the lease was lost meanwhile (perhaps won again: a new term): nothing of it is carried out
        if self.observer is not None:
            self.observer.on_cycle(engine, result, now, time.perf_counter() - started)
        self.stats.cycles += 1
        self.carry.start(result)
        await self._report(now)

    async def _beating(self, waited: Awaitable[None], limit: float) -> None:
        """Await `waited` (a fresh list) beating meanwhile, for at most `limit` seconds: a list of a large
        cluster is slow, not hung; one that has not come back after `limit` (it is retried on failure, each
        attempt under a timeout) is treated as wedged, and the heartbeat stops."""
        task = asyncio.ensure_future(waited)
        end = time.monotonic() + limit
        try:
            while not task.done() and time.monotonic() < end:
                self.heartbeat.beat()
                await asyncio.wait({task}, timeout=self.heartbeat.every)
            await task
        finally:
            task.cancel()

    def _in_term(self) -> bool:
        """This replica leads, in the term its engine was rebuilt for (not one lost and won again since)."""
        return self.leading.is_set() and self.term() == self._term

    def _lost(self) -> None:
        """The lease is gone: nothing of this term is carried out any more (carryout.CarryOut.lost)."""
        self.carry.lost()
        self.wake.set()

    async def _report(self, now: float) -> None:
        engine = self.engine
        assert engine is not None

        def uid(key: str) -> str | None:
            obj = self.pods.cache.get(key)
            return None if obj is None else obj["metadata"].get("uid", "")

        explaining = self.reporter.report_pending(
            engine, lambda name: self.members.get(name, ()), lambda k: k not in self.inflight, uid, now
        )
        await _in_slices(explaining, REPORT_BUDGET, self.heartbeat.beat)
        if engine is not self.engine or not self._in_term():
            return
        if now - self._status_at >= self.status_every:
            self._status_at = now
            self.reporter.report_queues(engine)


async def _in_slices(
    steps: Iterator[object], budget: float = math.inf, beat: Callable[[], None] = lambda: None
) -> None:
    """Drive `steps` with the event loop free at least every CYCLE_SLICE seconds, so informers and binds on the
    same loop are not held up; stop after `budget` seconds. `beat` at each slice: a long cycle that progresses
    is a live loop."""
    started = time.perf_counter()
    slice_end = started + CYCLE_SLICE
    for _ in steps:
        now = time.perf_counter()
        if now - started > budget:
            return
        if now > slice_end:
            beat()
            await asyncio.sleep(0)
            slice_end = time.perf_counter() + CYCLE_SLICE
