"""Carrying out the engine's decisions: binds and evictions, and what stays booked while they resolve.

A cycle's placements are bound concurrently, its evictions sent through the Eviction API. Their tasks only
record what became of them; `settle`, at the next pass, acts on it, so nothing but the pass changes the
engine. A workload's GPUs stay booked until every bind of it has resolved: bound (seen landed, even with
its answer lost), bound elsewhere, gone, or certainly unbound. A gang some of whose members landed retries
its failed binds in the room held for it, a few times, then is undone whole (landed members evicted, their
room held until they are gone). Every write that carries out a decision (Binding, Eviction, annotation, node
lock, gang mark) passes the lease's fence and is counted while on the wire (writes.py); losing the lease
cancels all that is under way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from fairgpu.errors import BindError, FenceClosed, KubeError, RequestError
from fairgpu.framework.interfaces import Evict
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.k8s import hami
from fairgpu.k8s.binder import Binder, device_string, mig_string
from fairgpu.k8s.holdings import Holdings
from fairgpu.k8s.parsed import ParsedPods
from fairgpu.k8s.port import PODS, KubePort
from fairgpu.k8s.reporter import Reporter
from fairgpu.k8s.translate import PodInfo
from fairgpu.k8s.workloads import GANG_ADMITTED
from fairgpu.k8s.writes import Writes
from fairgpu.state import Placement

log = logging.getLogger(__name__)
# A victim whose eviction was refused (a PodDisruptionBudget's 429) is not chosen again for this long.
REFUSED_BACKOFF = 60.0
FENCE_MARGIN = 0.5  # a write carrying out a decision is sent only while the lease is held for at least this long
UNDO_RETRY = 1.0  # seconds between a gang's rollbacks stopped by a closed fence (the term may go on)
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


class CarryOut:
    def __init__(
        self,
        port: KubePort,
        reporter: Reporter,
        parsed: ParsedPods,
        pod_cache: Callable[[str], dict | None],
        lease_left: Callable[[], float],
        wake: Callable[[], None],
        stats: Stats,
        seen_at: dict[str, float],
        writes: Writes,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.port, self.reporter, self.parsed, self.pod_cache = port, reporter, parsed, pod_cache
        self.writes = writes  # every write below passes the fence through it, and counts while on the wire
        self.lease_left, self.wake, self.stats, self.seen_at, self.clock = lease_left, wake, stats, seen_at, clock
        self.binder: Binder | None = None  # set by the controller, which wires it to its caches
        self.engine: Scheduler | None = None
        self.book: Holdings | None = None
        self.inflight: set[str] = set()  # pods whose bind is under way
        self._target: dict[str, str] = {}  # pod → node, while its bind task runs
        # Binds that landed (seen by us before the pod cache shows them): pod → its UID. Their room is kept when
        # the workload is dropped. By UID: a pod made again under the name before a pass saw the bound one is
        # another pod, which must be scheduled (taken for the bound one, it was adopted as running and never
        # scheduled, and its mark kept the cache from ever counting as quiet: no rebuild again).
        # Failed binds per workload, with what became of the pod (see _outcome).
        self._landed: dict[str, str] = {}
        self._failed: dict[str, dict[str, str]] = {}
        self._attempts: dict[str, int] = {}  # bind attempts per pod, this engine
        self._undoing: set[str] = set()  # gangs whose landed members are being evicted
        self._refusals: list[tuple[str, float]] = []  # (workload, retry at) of refused evictions, to apply
        self._tasks: set[asyncio.Task] = set()

    # -- what the controller asks ---------------------------------------------------------------------------
    def reset(self, engine: Scheduler, book: Holdings) -> None:
        """A new engine: outcomes recorded against the old one no longer apply (binds in flight stay)."""
        self.engine, self.book = engine, book
        self._failed.clear()
        self._undoing.clear()
        self._refusals.clear()
        self._attempts.clear()

    def fence(self) -> None:
        """Raise FenceClosed unless this replica still leads for long enough to send a write."""
        if self.lease_left() < FENCE_MARGIN:
            raise FenceClosed("the lease is not held with margin; not sending")

    def start(self, result: CycleResult) -> None:
        """Carry out a cycle: its binds, a workload's together, and its evictions."""
        decided: dict[str, list[tuple[str, Placement]]] = {}
        for b in result.bound:
            self.inflight.add(b.pod_name)
            decided.setdefault(b.workload, []).append((b.pod_name, b.placement))
        for workload, binds in decided.items():
            self.spawn(self._commit(workload, binds))
        for ev in result.evictions:
            if ev.pods is not None:
                self._book().shrinking[ev.workload] = ev.pods
            self.spawn(self._evict(ev, math.ceil(ev.grace)))

    def seen(self, key: str) -> None:
        """The pod cache shows this pod's truth (bound, or gone): what we knew of its bind is no longer needed."""
        self._landed.pop(key, None)
        self._attempts.pop(key, None)

    def busy(self, key: str, node: str) -> bool:
        """A bind of this pod to this node is under way, or a bind of it landed and the pod cache does not show
        it yet: a lock it holds on the node may be needed."""
        return self._target.get(key) == node or key in self._landed

    def resolving(self, workload: str) -> bool:
        """Some bind of this workload is in flight or failed and not yet settled: it lets go of nothing."""
        return workload in self._failed or any(k in self.inflight for k in self._book().members[workload])

    def quiet(self) -> bool:
        """No bind under way, and every landed bind shows in the pod cache: the cache alone tells what runs."""
        for key, uid in list(self._landed.items()):
            obj = self.pod_cache(key)
            if obj is None or (obj.get("spec") or {}).get("nodeName") or obj["metadata"].get("uid") != uid:
                del self._landed[key]
        return not self.inflight and not self._landed

    def lost(self) -> None:
        """The lease is gone: no bind or eviction of this term goes on. What they leave behind is read from
        the cluster when this replica leads again."""
        for task in list(self._tasks):
            task.cancel()
        self.inflight.clear()
        self._target.clear()
        self._landed.clear()  # the new term's first list shows them

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def is_bound(self, key: str) -> bool:
        p = self.parsed.infos.get(key)
        landed = self._landed.get(key)
        return (landed is not None and (p is None or p.uid == landed)) or (
            p is not None and p.node is not None and not p.terminal
        )

    def drop(
        self,
        name: str,
        pods: dict[str, PodInfo],
        elsewhere: AbstractSet[str] = frozenset(),
        finished_at: float | None = None,
    ) -> None:
        self._undoing.discard(name)
        self._book().drop(name, pods, elsewhere, finished_at)

    def _book(self) -> Holdings:
        assert self.book is not None
        return self.book

    # -- settling what finished -------------------------------------------------------------------------
    def settle(self) -> bool:
        """Act on finished binds and refused evictions; True when the engine's inputs changed. A workload
        with a failed bind lets go of nothing while any bind of it is in flight. Then: a gang some of whose
        members landed retries the failed binds in the room still held for them (a few times), else is undone
        whole; any other workload is dropped, its landed members running on as a workload of their own, the
        rest resubmitted."""
        engine, book = self.engine, self._book()
        assert engine is not None
        changed = False
        for workload, until in self._refusals:
            if workload in book.members:
                engine.eviction_refused(workload, until)
                book.shrinking.pop(workload, None)
                changed = True
        self._refusals.clear()
        for name in list(self._failed):
            keys = book.members.get(name)
            if keys is None or name in self._undoing:
                del self._failed[name]
                continue
            if any(k in self.inflight for k in keys):
                continue
            failed = self._failed.pop(name)
            landed = [k for k in keys if self.is_bound(k) and failed.get(k) != ELSEWHERE]
            if landed and name in book.gangs:
                retry = [k for k, why in failed.items() if why == FAILED and self._attempts.get(k, 0) < BIND_ATTEMPTS]
                if len(retry) == len(failed):
                    for k in retry:
                        placement = engine.state.placement(k)
                        assert placement is not None
                        self.inflight.add(k)
                        self.spawn(self._bind(name, k, placement, delay=0.2 * self._attempts[k]))
                    continue
                self.stats.rollbacks += 1
                self._undoing.add(name)
                self.spawn(self._undo_gang(name, keys, landed))
                continue
            self.stats.rollbacks += 1
            self.drop(name, self.parsed.infos, {k for k, why in failed.items() if why == ELSEWHERE})
        return changed

    # -- binds ------------------------------------------------------------------------------------------
    async def _commit(self, workload: str, binds: list[tuple[str, Placement]]) -> None:
        """Bind a workload's placed pods concurrently. A gang's members are first marked admitted: if this
        scheduler dies with the gang half bound, its successor must place the rest without waiting for
        members that already ran and are gone."""
        members = self._book().members.get(workload, ())
        if len(members) > 1:
            try:
                for key in members:
                    info = self.parsed.infos.get(key)
                    if info is not None and info.annotations.get(GANG_ADMITTED) == "true":
                        continue  # marked when the gang started; an elastic one's later pods need no second patch
                    ns, name = key.split("/", 1)
                    mark = {"metadata": {"annotations": {GANG_ADMITTED: "true"}}}
                    await self.writes.send(self.fence, self.port.patch, PODS, name, mark, ns)
            except (KubeError, FenceClosed) as err:
                log.warning("gang %s not marked admitted: %s; rolling back", workload, err)
                for key, _ in binds:
                    self.inflight.discard(key)
                    self._failed.setdefault(workload, {})[key] = FAILED
                self.wake()
                return
        await asyncio.gather(*(self._bind(workload, key, placement) for key, placement in binds))

    async def _bind(self, workload: str, key: str, placement: Placement, delay: float = 0.0) -> None:
        """Every decided bind starts at once: the client's connection pool bounds the requests in flight, and
        HAMi's node lock lines up the binds to one node. A cap on binds in flight would be held by binds
        waiting for a node's lock, so one binpacked node's queue would stall binds to every other node.
        A failed bind is resolved before it stops holding its room: the pod is read from the API server
        (its Binding may have landed with the answer lost). What is learnt is recorded; the next pass acts."""
        engine, binder = self.engine, self.binder
        assert engine is not None and binder is not None
        p = self.parsed.infos.get(key) if self.pod_cache(key) is not None else None  # parsed at the placing pass
        node = engine.state.node_names[placement.node]
        gpus = engine.state.nodes[placement.node].gpus
        devices = [
            hami.DeviceUse(gpus[s].uuid, hami.VENDOR, m, c)
            for s, c, m in zip(placement.slots, placement.cores, placement.mem_mib, strict=True)
        ]
        self._attempts[key] = self._attempts.get(key, 0) + 1
        self._target[key] = node
        try:
            await asyncio.sleep(delay)
            if p is None:
                raise BindError("pod disappeared before its bind")
            await binder.bind(p, node, devices, placement.segments, mig_string(p, placement, gpus))
            self._landed[key] = p.uid
            self.stats.binds += 1
            self.stats.bind_latency.append(self.clock() - self.seen_at.pop(key, self.clock()))
            self.reporter.scheduled(key, p.uid, node)
        except (BindError, KubeError, RequestError) as err:
            self.stats.bind_failures += 1
            outcome = (
                GONE
                if p is None
                else await self._outcome(p, node, device_string(p, devices, placement.segments) if devices else "")
            )
            log.warning("bind %s failed (%s): %s", key, outcome, err)
            if p is not None and outcome == LANDED:
                self._landed[key] = p.uid
                self.stats.binds += 1
            else:
                self._failed.setdefault(workload, {})[key] = outcome
        finally:
            self.inflight.discard(key)
            self._target.pop(key, None)
            self.wake()

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

    # -- evictions --------------------------------------------------------------------------------------
    async def _undo_gang(self, name: str, keys: tuple[str, ...], landed: list[str]) -> None:
        """A gang that cannot be completed: its members lose the admitted mark (so what is left waits for a
        whole gang again), then its landed members are evicted. The engine holds all of its room until they
        are gone; their absence then drops the workload. A closed fence stops it until it opens again (a
        renewal in time keeps the term); a lost term cancels it."""
        done: set[str] = set()
        while True:
            try:
                await self._unmark_and_evict(name, keys, landed, done)
                return
            except FenceClosed:
                await asyncio.sleep(UNDO_RETRY)

    async def _unmark_and_evict(self, name: str, keys: tuple[str, ...], landed: list[str], done: set[str]) -> None:
        for key in keys:
            ns, pod = key.split("/", 1)
            unmark = {"metadata": {"annotations": {GANG_ADMITTED: None}}}
            with contextlib.suppress(KubeError):  # a member gone already needs no unmarking
                await self.writes.send(self.fence, self.port.patch, PODS, pod, unmark, ns)
        for key in landed:
            if key in done:
                continue
            p = self.parsed.infos.get(key)
            ns, pod = key.split("/", 1)
            try:
                await self.writes.send(self.fence, self.port.evict, ns, pod, None, p.uid if p is not None else None)
                self.reporter.preempted(key, f"gang {name} could not be bound whole and was rolled back")
            except KubeError as err:
                if err.code not in (404, 409):  # 409: the UID precondition, a new pod of that name
                    log.warning("rolling back gang %s: %s stays: %s", name, key, err)
            done.add(key)

    async def _evict(self, ev: Evict, grace: int) -> None:
        """Evict a victim through the Eviction API with its queue's grace period and the pod's UID as a
        precondition (a new pod of the same name is never the victim): every pod of a whole workload, only
        the named extra pods of an elastic one. A refusal (a PodDisruptionBudget's 429, or any failure but
        the pod being gone already) stops there: the victim keeps running, out of choice for REFUSED_BACKOFF
        seconds, and its preemptor picks another victim at its next attempt. A closed fence stops it too: the
        victim keeps running, its preemptor plans again (if this replica still leads: a renewal in time)."""
        book = self._book()
        keys = book.members.get(ev.workload, ())
        if ev.pods is not None:
            keys = tuple(keys[i] for i in ev.pods)
        # The UIDs of the pods the engine chose, taken now: while one eviction is on the wire a pass may parse a
        # new pod made under a victim's name, which is not the victim (its UID went on the wire before).
        uids = {key: book.uids.get(key) for key in keys}
        for key in keys:
            ns, name = key.split("/", 1)
            try:
                await self.writes.send(self.fence, self.port.evict, ns, name, grace, uids[key])
            except FenceClosed as err:
                log.info("eviction of %s not sent: %s", key, err)
                self._refusals.append((ev.workload, self.clock()))
                break
            except KubeError as err:
                if err.code in (404, 409):  # 409: the UID precondition, a new pod of that name
                    continue  # gone already: what an eviction wants
                log.info("eviction of %s refused: %s", key, err)
                self._refusals.append((ev.workload, self.clock() + REFUSED_BACKOFF))
                break
            self.stats.evictions += 1
            self.reporter.preempted(key, ev.reason)
        self.wake()
