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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field

import numpy as np

from fairgpu import resources as r
from fairgpu.errors import BindError, KubeError, RequestError, StateError
from fairgpu.framework.interfaces import Evict
from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.hamiconfig import DEFAULT as DEFAULT_HAMI
from fairgpu.hamiconfig import HamiConfig
from fairgpu.k8s import hami
from fairgpu.k8s.binder import Binder
from fairgpu.k8s.informer import Informer
from fairgpu.k8s.port import NODES, PODS, QUEUES, KubePort
from fairgpu.k8s.queues import QueueEntry, queue_from_cr
from fairgpu.k8s.reporter import Reporter
from fairgpu.k8s.translate import NodeInputs, PodInfo, hold, holdings, node_spec, pod_info, refused_gpus
from fairgpu.model import NodeSpec, QueueTree, Workload
from fairgpu.state import Placement

log = logging.getLogger(__name__)
SCHEDULER_NAME = "fairgpu"
GANG_ADMITTED = "fairgpu.io/gang-admitted"  # on every member once a gang starts binding
# A victim whose eviction was refused (a PodDisruptionBudget's 429) is not chosen again for this long.
REFUSED_BACKOFF = 60.0


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
        leading: asyncio.Event | None = None,
        on_cycle: Callable[[Scheduler, CycleResult, float, float], None] | None = None,
        hami_config: HamiConfig = DEFAULT_HAMI,
    ) -> None:
        self.port = port
        self.hami = hami_config  # resource names and request defaults; the binder's lock expiry
        self.on_cycle = on_cycle  # (engine, result, now, seconds): metrics of each cycle
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
        )
        self.reporter = Reporter(port, scheduler_name)
        self.stats = Stats()
        self.wake = asyncio.Event()
        self.nodes = Informer(port, NODES, self._node_event)
        self.pods = Informer(port, PODS, self._pod_event)
        self.queues = Informer(port, QUEUES, self._queue_event)
        self.namespaces: dict[str, tuple[str, ...]] = {}  # valid queue → namespaces that may use it
        self.engine: Scheduler | None = None
        self._built_from: tuple | None = None
        self.fixed: dict[str, list[str]] = {}  # others' pods (and ours without a queue) pinned: their ledger keys
        self.unaccounted: dict[str, str] = {}  # pinned pods whose HAMi record could not be read or did not fit
        self.owned: dict[str, str] = {}  # pod key → engine workload holding it
        self.members: dict[str, tuple[str, ...]] = {}  # engine workload → its pod keys
        self.inflight: set[str] = set()  # pods whose bind is under way
        self.shrinking: dict[str, tuple[int, ...]] = {}  # elastic workload → its pods being evicted
        self.seen_at: dict[str, float] = {}  # when each pending pod was first seen, for latency
        self.queue_errors: dict[str, str] = {}
        # Pods changed since the last pass: a pass looks only at these, so its cost follows the events,
        # not the cluster's size. A rebuild looks at every pod again.
        self._dirty: set[str] = set()
        self._all_dirty = True
        self._infos: dict[str, PodInfo] = {}
        self._bad: dict[str, str] = {}
        self._groups: dict[tuple[str, str], set[str]] = {}  # (namespace, pod group) → member keys
        self._node_parsed: dict[str, tuple[NodeInputs, NodeSpec | None]] = {}
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
        if leading is None:  # without an elector this replica always leads
            leading = asyncio.Event()
            leading.set()
        self.leading = leading

    def synced(self) -> bool:
        """Every informer has listed once: the caches are warm (on a standby too)."""
        return all(i.synced.is_set() for i in (self.nodes, self.pods, self.queues))

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
                    self._built_from = None  # a new leader rebuilds from the cluster, not from a stale engine
                    self.wake.set()
                waiting = self.engine is not None and bool(self.engine.pending)
                with contextlib.suppress(TimeoutError):  # waiting work is retried without news, too
                    await asyncio.wait_for(self.wake.wait(), self.retry_every if waiting else None)
                self.wake.clear()
                if self.leading.is_set():
                    self.step()
                await asyncio.sleep(min_interval)  # let a burst of events land before the next cycle
        finally:
            for t in informers + list(self._tasks):
                t.cancel()
            await asyncio.gather(*informers, *self._tasks, return_exceptions=True)
            await self.reporter.close()

    def step(self) -> None:
        """One reconcile + engine cycle; starts the binds and evictions it decides."""
        now = self.clock()
        self._reconcile(now)
        if self.engine is None:
            return
        if not self._engine_changed and now - self._cycled_at < self.retry_every:
            return
        self._engine_changed, self._cycled_at = False, now
        started = time.perf_counter()
        result = self.engine.cycle(now)
        if self.on_cycle is not None:
            self.on_cycle(self.engine, result, now, time.perf_counter() - started)
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
        self._report_pending(now)
        if now - self._status_at >= self.status_every:
            self._status_at = now
            self._report_queues()

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- reconcile ----------------------------------------------------------------------------------------
    def _queue_entries(self) -> list[QueueEntry]:
        entries, errors = [], {}
        for obj in self.queues.cache.values():
            try:
                entries.append(queue_from_cr(obj))
            except ValueError as err:
                errors[obj["metadata"]["name"]] = str(err)
        # A queue whose parent is missing (or invalid) is left out with its children, not the whole tree.
        while True:
            names = {e.spec.name for e in entries}
            orphans = [e for e in entries if e.spec.parent is not None and e.spec.parent not in names]
            if not orphans:
                break
            for e in orphans:
                errors[e.spec.name] = f"spec.parent: queue {e.spec.parent!r} does not exist or is invalid"
            entries = [e for e in entries if e not in orphans]
        for name, problem in errors.items():
            if self.queue_errors.get(name) != problem:
                self._spawn(self.reporter.queue_invalid(name, problem))
        self.queue_errors = errors
        return entries

    def _reconcile(self, now: float) -> None:
        if self._inputs_changed:
            node_specs = self._read_nodes()
            entries = self._queue_entries()
            try:
                tree = QueueTree([e.spec for e in entries])
            except ValueError as err:
                log.error("queues: %s", err)
                return
            self.namespaces = {e.spec.name: e.namespaces for e in entries}
            shape = (tuple(node_specs), repr(tree.queues))
            if shape != self._built_from:
                if self.inflight:
                    self.wake.set()  # rebuild once the binds under way have landed
                    return
                self._rebuild(node_specs, tree, shape)
            self._inputs_changed = False
        engine = self.engine
        assert engine is not None
        keys = set(self.pods.cache) | set(self._infos) | set(self._bad) if self._all_dirty else self._dirty
        self._all_dirty, self._dirty = False, set()
        pods, bad = self._read_pods(keys)
        # Pods that are gone or finished release what they hold.
        for key in keys:
            p = pods.get(key)
            gone = p is None or p.terminal
            if gone and key in self.fixed:
                self._unhold(key)
            if gone and key in self.owned:
                if key in self.inflight:
                    self._dirty.add(key)  # look again once its bind has finished
                elif not self._shrunk(self.owned[key], pods):
                    self._drop_workload(self.owned[key], pods)
        # Bound pods the engine does not hold: ours run on as workloads (a group's members as one), others'
        # are pinned where they run.
        found: dict[str, list[PodInfo]] = {}
        for key in keys:
            p = pods.get(key)
            if p is not None and p.node and not p.terminal and key not in self.owned and key not in self.fixed:
                if p.scheduler == self.scheduler_name:
                    found.setdefault(f"{p.namespace}/group:{p.group}" if p.group else key, []).append(p)
                else:
                    self._pin(p)
        for name, members in found.items():
            self._adopt(name, members)
        self._submit_pending(keys | self._dirty, pods, bad, now)

    def _rebuild(self, node_specs: list[NodeSpec], tree: QueueTree, shape: tuple) -> None:
        """A new engine for a changed inventory or queue set; every pod is re-derived from the cache."""
        self.engine = Scheduler(node_specs, tree, self.profile)
        self._engine_changed = True
        self._built_from = shape
        self.fixed.clear()
        self.unaccounted.clear()
        self.owned.clear()
        self.members.clear()
        self.shrinking.clear()
        self._all_dirty = True
        self.stats.rebuilds += 1

    def _pin(self, p: PodInfo) -> None:
        """Another scheduler's pod takes its room where it runs, charged to nobody."""
        engine = self.engine
        assert engine is not None and p.node is not None
        ni = engine.state.node_index.get(p.node)
        if ni is not None:
            self._fix(p, *holdings(p, engine.state, ni))

    def _found_placement(self, p: PodInfo) -> Placement | None:
        """Where a bound pod runs as one Placement the engine can adopt; None off our inventory, or when its
        HAMi record has another shape (then it is pinned, every card it names accounted)."""
        engine = self.engine
        assert engine is not None and p.node is not None
        ni = engine.state.node_index.get(p.node)
        found, problem = holdings(p, engine.state, ni) if ni is not None else ([], None)
        if len(found) == 1 and problem is None:
            return found[0]
        if found:
            self._fix(p, found, problem)
        return None

    def _fix(self, p: PodInfo, placements: list[Placement], problem: str | None = None) -> None:
        """Hold what a pod holds, every entry of its record (hold); what cannot be read or does not fit is an
        Event on the pod and counts in fairgpu_hami_unaccounted_pods, never ignored."""
        engine = self.engine
        assert engine is not None
        keys, over = hold(engine.state, p.key, placements)
        problems = ([problem] if problem else []) + over
        if problems:
            message = "; ".join(problems)
            log.warning("pod %s on %s: %s", p.key, p.node, message)
            self.unaccounted[p.key] = message
            self.reporter.allocation_unreadable(p.key, p.uid, message)
        self._engine_changed = True
        self.fixed[p.key] = keys

    def _adopt(self, name: str, members: list[PodInfo], placements: list[Placement] | None = None) -> None:
        """Our pods found running (after a restart, a rebuild of the engine, or a gang member's exit) run on as
        a workload of their queue: charged to it, and victims for reclaim and fair-share preemption like any
        it placed. A group's running members are one workload, so they are evicted together. Without a queue
        they are pinned, charged to nobody."""
        engine = self.engine
        assert engine is not None
        if placements is None:
            found = [(m, self._found_placement(m)) for m in members]
            members = [m for m, pl in found if pl is not None]
            placements = [pl for _, pl in found if pl is not None]
            if not members:
                return
        if name in self.members:
            name = f"{name}/{members[0].name}"
        queue, _ = self._queue_for(members[0])
        try:
            wl = Workload(
                name=name,
                queue=queue or "",
                pods=tuple(m.spec for m in members),
                submit_time=min(m.created for m in members),
                priority=max(m.priority for m in members),
                duration=members[0].duration,
                user=members[0].user,
                pod_names=tuple(m.key for m in members),
            )
            engine.adopt(wl, placements, started=min(m.started for m in members))
        except (RequestError, StateError) as err:  # no queue for them (any more), or not all of them fit
            log.warning("pods of %s pinned where they run, charged to no queue: %s", name, err)
            for m, placement in zip(members, placements, strict=True):
                self._fix(m, [placement])
            return
        self._engine_changed = True
        self.members[name] = wl.pod_names
        for m in members:
            self.owned[m.key] = name

    def _unhold(self, key: str) -> None:
        engine = self.engine
        assert engine is not None
        for k in self.fixed.pop(key):
            engine.state.release(k)
        self.unaccounted.pop(key, None)
        self._engine_changed = True

    def _shrunk(self, name: str, pods: dict[str, PodInfo]) -> bool:
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
            self.members[name] = tuple(k for i, k in enumerate(keys) if i not in gone)
            self._engine_changed = True
            self.wake.set()
        return True

    def _drop_workload(self, name: str, pods: dict[str, PodInfo]) -> None:
        """Take a workload out of the engine; members that run stay on as a workload of their own, pending
        ones get resubmitted."""
        engine = self.engine
        assert engine is not None
        keys = self.members.pop(name, ())
        self.shrinking.pop(name, None)
        released = engine.remove(name)
        self._engine_changed = True
        for key in keys:
            self.owned.pop(key, None)
            self._dirty.add(key)  # pending members are resubmitted on the next pass
        self.wake.set()
        running = [
            (p, placement)
            for key, placement in zip(keys, released, strict=False)
            if (p := pods.get(key)) is not None and p.node and not p.terminal and key not in self.inflight
        ]
        if running:
            self._adopt(name, [p for p, _ in running], [placement for _, placement in running])

    def _queue_for(self, p: PodInfo) -> tuple[str | None, str]:
        if p.queue_label is not None:
            allowed = self.namespaces.get(p.queue_label)
            if allowed is None:
                return None, f"queue {p.queue_label!r} does not exist"
            if allowed and p.namespace not in allowed:
                return None, f"namespace {p.namespace} may not use queue {p.queue_label!r}"
            return p.queue_label, ""
        for name, allowed in self.namespaces.items():
            if p.namespace in allowed:
                return name, ""
        return None, f"no queue serves namespace {p.namespace}; label the pod fairgpu.io/queue"

    def _submit_pending(self, keys: set[str], pods: dict[str, PodInfo], bad: dict[str, str], now: float) -> None:
        engine = self.engine
        assert engine is not None
        groups: dict[tuple[str, str], list[PodInfo]] = {}
        for key in keys & bad.keys():
            problem = bad[key]
            obj = self.pods.cache[key]
            if (obj.get("spec") or {}).get("schedulerName") == self.scheduler_name and not obj["spec"].get("nodeName"):
                self.reporter.unschedulable(key, obj["metadata"].get("uid", ""), problem)

        def waiting(p: PodInfo) -> bool:
            if p.scheduler != self.scheduler_name or p.node or p.terminal or p.deleting:
                return False
            return p.key not in self.owned and p.key not in self.inflight

        for key in keys:
            p = pods.get(key)
            if p is None:
                continue
            if p.group:
                groups.setdefault((p.namespace, p.group), [])
            elif waiting(p):
                self._submit([p], key, now)
        for gid in groups:
            everyone = [pods[k] for k in self._groups.get(gid, ()) if k in pods]
            groups[gid] = [m for m in everyone if waiting(m)]
        for (ns, group), members in groups.items():
            if not members:
                continue
            bound = sum(1 for k in self._groups.get((ns, group), ()) if k in pods and pods[k].node)
            admitted = any(m.annotations.get(GANG_ADMITTED) == "true" for m in members)
            need = 0 if admitted else max(m.min_members for m in members) - bound
            if len(members) < need:
                for m in members:
                    self.reporter.unschedulable(
                        m.key, m.uid, f"gang {group}: {len(members) + bound} of {need + bound} members exist"
                    )
                continue
            members.sort(key=lambda m: m.name)
            # Members beyond what the gang still needs are elastic: they run as room allows and are the first
            # given back when another queue reclaims. Members that join a running group form a workload of
            # their own, named after their first member.
            least = max(1, need)
            name = f"{ns}/group:{group}"
            if name in self.members:
                name = f"{name}/{members[0].name}"
            self._submit(members, name, now, least if len(members) > least else None)

    def _submit(self, members: list[PodInfo], name: str, now: float, min_pods: int | None = None) -> None:
        engine = self.engine
        assert engine is not None
        first = members[0]
        queue, why = self._queue_for(first)
        if queue is None:
            for m in members:
                self.reporter.unschedulable(m.key, m.uid, why)
            return
        wl = Workload(
            name=name,
            queue=queue,
            pods=tuple(m.spec for m in members),
            submit_time=min(m.created for m in members),
            priority=max(m.priority for m in members),
            duration=first.duration,
            user=first.user,
            pod_names=tuple(m.key for m in members),
            min_pods=min_pods,
        )
        try:
            engine.submit(wl)
        except RequestError as err:
            for m in members:
                self.reporter.unschedulable(m.key, m.uid, str(err))
            return
        self._engine_changed = True
        self.members[name] = wl.pod_names
        for m in members:
            self.owned[m.key] = name

    # -- decisions ----------------------------------------------------------------------------------------
    async def _commit(self, workload: str, binds: list[tuple[str, Placement]]) -> None:
        """Bind a workload's placed pods concurrently. A gang's members are first marked admitted: if this
        scheduler dies with the gang half bound, its successor must place the rest without waiting for
        members that already ran and are gone."""
        if len(self.members.get(workload, ())) > 1:
            try:
                for key in self.members[workload]:
                    info = self._infos.get(key)
                    if info is not None and info.annotations.get(GANG_ADMITTED) == "true":
                        continue  # marked when the gang started; an elastic one's later pods need no second patch
                    ns, name = key.split("/", 1)
                    await self.port.patch(PODS, name, {"metadata": {"annotations": {GANG_ADMITTED: "true"}}}, ns)
            except KubeError as err:
                log.warning("gang %s not marked admitted: %s; rolling back", workload, err)
                for key, _ in binds:
                    self.inflight.discard(key)
                if workload in self.members:
                    self.stats.rollbacks += 1
                    self._drop_workload(workload, self._pod_infos())
                self.wake.set()
                return
        await asyncio.gather(*(self._bind(workload, key, placement) for key, placement in binds))

    async def _bind(self, workload: str, key: str, placement: Placement) -> None:
        """Every decided bind starts at once: the client's connection pool bounds the requests in flight, and
        HAMi's node lock lines up the binds to one node. A cap on binds in flight would be held by binds
        waiting for a node's lock, so one binpacked node's queue would stall binds to every other node."""
        engine = self.engine
        assert engine is not None
        p = self._infos.get(key) if key in self.pods.cache else None  # parsed at the pass that placed it
        try:
            if p is None:
                raise BindError("pod disappeared before its bind")
            node = engine.state.node_names[placement.node]
            gpus = engine.state.nodes[placement.node].gpus
            devices = [
                hami.DeviceUse(gpus[s].uuid, "NVIDIA", m, placement.cores)
                for s, m in zip(placement.slots, placement.mem_mib, strict=True)
            ]
            await self.binder.bind(p, node, devices)
            self.stats.binds += 1
            self.stats.bind_latency.append(self.clock() - self.seen_at.pop(key, self.clock()))
            self.reporter.scheduled(key, p.uid, node)
        except (BindError, KubeError, RequestError) as err:
            self.stats.bind_failures += 1
            log.warning("bind %s failed: %s; rolling back %s", key, err, workload)
            self.inflight.discard(key)
            if engine is self.engine and workload in self.members:
                self.stats.rollbacks += 1
                self._drop_workload(workload, self._pod_infos())
        finally:
            self.inflight.discard(key)
            self.wake.set()

    def _read_nodes(self) -> list[NodeSpec]:
        """Node specs, parsed again only when what they are read from changed (a bind's node lock changes the
        node, not its GPUs); the same NodeSpec objects come back while nothing changed, so comparing
        inventories stays cheap."""
        specs: list[NodeSpec] = []
        parsed: dict[str, tuple[NodeInputs, NodeSpec | None]] = {}
        for key, obj in sorted(self.nodes.cache.items()):
            inputs = NodeInputs.of(obj)
            hit = self._node_parsed.get(key)
            if hit is None or hit[0] != inputs:
                try:
                    spec: NodeSpec | None = node_spec(inputs)
                    refused = refused_gpus(inputs)
                    if refused is not None:
                        self.reporter.gpus_refused(inputs.name, refused)
                except ValueError as err:
                    log.warning("node %s left out: %s", inputs.name, err)
                    spec = None
                if hit is not None and hit[1] is not None and spec == hit[1]:
                    spec = hit[1]  # unchanged inventory: keep the identical object
                hit = (inputs, spec)
            parsed[key] = hit
            if hit[1] is not None:
                specs.append(hit[1])
        self._node_parsed = parsed
        return specs

    def _pod_infos(self) -> dict[str, PodInfo]:
        return self._infos

    def _read_pods(self, keys: set[str]) -> tuple[dict[str, PodInfo], dict[str, str]]:
        """Bring the parsed view of these pods up to date with the cache: PodInfo, or why it cannot be read."""
        for key in keys:
            old = self._infos.pop(key, None)
            self._bad.pop(key, None)
            if old is not None and old.group:
                self._groups.get((old.namespace, old.group), set()).discard(key)
            obj = self.pods.cache.get(key)
            if obj is None:
                continue
            try:
                p = pod_info(obj, self.hami.rules())
            except (RequestError, ValueError) as err:
                self._bad[key] = str(err)
                continue
            if p.problem is not None and not p.node:  # not ours to schedule; once bound, it is accounted
                self._bad[key] = p.problem
                continue
            self._infos[key] = p
            if p.group:
                self._groups.setdefault((p.namespace, p.group), set()).add(key)
        return self._infos, self._bad

    async def _evict(self, ev: Evict, grace: int) -> None:
        """Evict a victim through the Eviction API with its queue's grace period: every pod of a whole
        workload, only the named extra pods of an elastic one. A refusal (a PodDisruptionBudget's 429, or
        any failure but the pod being gone already) stops there: the victim keeps running, out of choice for
        REFUSED_BACKOFF seconds, and its preemptor picks another victim at its next attempt."""
        keys = self.members.get(ev.workload, ())
        if ev.pods is not None:
            keys = tuple(keys[i] for i in ev.pods)
        for key in keys:
            ns, name = key.split("/", 1)
            try:
                await self.port.evict(ns, name, grace)
            except KubeError as err:
                if err.code == 404:
                    continue  # gone already: what an eviction wants
                log.info("eviction of %s refused: %s", key, err)
                if self.engine is not None:
                    self.engine.eviction_refused(ev.workload, self.clock() + REFUSED_BACKOFF)
                    self.shrinking.pop(ev.workload, None)
                    self._engine_changed = True
                break
            self.stats.evictions += 1
            self.reporter.preempted(key, ev.reason)
        self.wake.set()

    def _report_queues(self) -> None:
        """Each valid queue's usage and fair share (engine view, fair dimensions) and its workload counts."""
        engine = self.engine
        assert engine is not None
        view, tree = engine.view, engine.tree
        pending = [0] * len(tree)
        admitted = [0] * len(tree)
        for entry in engine.pending.values():
            pending[entry.queue] += 1
        for entry in engine.running.values():
            admitted[entry.queue] += 1
        for q, spec in enumerate(tree.queues):
            self.reporter.queue_status(
                spec.name,
                {
                    "usage": _vector(view.usage[q]),
                    "fairShare": _vector(view.entitled[q]),
                    "pending": pending[q],
                    "admitted": admitted[q],
                    "conditions": [{"type": "Valid", "status": "True", "reason": "Accepted", "message": ""}],
                },
            )

    def _report_pending(self, now: float) -> None:
        engine = self.engine
        assert engine is not None
        for name in engine.pending:
            keys = self.members.get(name, ())
            pending = [k for k in keys if k not in self.inflight and engine.state.placement(k) is None]
            if not pending or not self.reporter.wants_explanation(pending[0], now):
                continue
            explanation = engine.explain(name, now)
            message = "; ".join(explanation.lines())
            for key in pending:
                obj = self.pods.cache.get(key)
                if obj is not None:
                    self.reporter.unschedulable(key, obj["metadata"].get("uid", ""), message)


def _vector(v: np.ndarray) -> dict[str, str]:
    """A fair vector (gpu, gpumem MiB, cpu millicores, memory MiB) as Kubernetes quantities."""
    gpu, gpumem, cpu, mem = (float(x) for x in v)
    return {r.GPU: f"{gpu:.2f}", r.GPUMEM: f"{int(gpumem)}Mi", r.CPU: f"{int(cpu)}m", r.MEMORY: f"{int(mem)}Mi"}
