"""Recording the cluster for the twin (twin/), on the controller's side of the line.

PodTimes: how long each workload's pods really ran. The engine starts a workload when it decides to bind
it; its pods run from when the kubelet starts them to when they exit, and that is the run length a replay
needs (binding takes the cluster time the simulator does not spend). Under `fairgpu run --record` it reads
the controller's own pod watch, so no second watch is opened.

Watcher: `fairgpu record`, the same trace from a workstation, scheduling nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from fairgpu.framework.interfaces import Evict
from fairgpu.k8s.informer import Informer
from fairgpu.k8s.parsed import ParsedNodes
from fairgpu.k8s.port import NODES, PODS, QUEUES, KubePort
from fairgpu.k8s.queues import queue_entries, queue_map
from fairgpu.k8s.translate import TERMINAL, PodInfo, pod_info
from fairgpu.k8s.workloads import by_workload, queue_for, workload_of
from fairgpu.model import NodeSpec, QueueSpec, Workload
from fairgpu.model.pod import DEFAULT_RULES, GpuRules
from fairgpu.twin.encode import queue_doc
from fairgpu.twin.recorder import Recorder, Seen
from fairgpu.twin.writer import TraceWriter

MAX_TRACKED = 200_000  # pods whose run is remembered until the recorder asks; beyond, the oldest are dropped


class PodTimes:
    def __init__(self, clock: Callable[[], float], scheduler_name: str) -> None:
        self.clock = clock
        self.scheduler_name = scheduler_name
        self._since: dict[str, tuple[str, float]] = {}  # pod key → (uid, when first seen running)
        self._ran: dict[str, float] = {}  # pod key → seconds it ran, once it stopped

    def attach(self, informer: Informer) -> None:
        """See every pod event before the informer's own handler (the controller), so a workload the
        controller drops for its pods' exit has its run length known by then."""
        handler = informer.handler

        def both(kind: str, obj: dict) -> None:
            self.on_event(kind, obj)
            handler(kind, obj)

        informer.handler = both

    def on_event(self, kind: str, obj: dict) -> None:
        if (obj.get("spec") or {}).get("schedulerName") != self.scheduler_name:
            return
        meta = obj["metadata"]
        key, uid = f"{meta.get('namespace', '')}/{meta['name']}", meta.get("uid", "")
        phase = (obj.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in TERMINAL:
            since = self._since.pop(key, None)
            ran = _terminated(obj) if phase in TERMINAL else None
            if ran is None and since is not None and since[0] == uid:
                ran = self.clock() - since[1]  # no container times: as long as this watch saw it run
            if ran is not None:
                self._ran[key] = ran
                if len(self._ran) > MAX_TRACKED:
                    del self._ran[next(iter(self._ran))]
        elif phase == "Running" and self._since.get(key, ("",))[0] != uid:
            self._since[key] = (uid, self.clock())

    def run_length(self, pods: Sequence[str]) -> float | None:
        """How long the longest of these pods ran (a gang's members start one by one; each runs its work),
        None if none has been seen to run and stop. Forgets them."""
        lengths = [self._ran.pop(k) for k in pods if k in self._ran]
        return max(lengths) if lengths else None


def _terminated(obj: dict) -> float | None:
    """How long the pod's containers ran, as its kubelet reports them (second resolution): from the first
    start to the last finish; None when a container's times are missing."""
    starts, ends = [], []
    for c in (obj.get("status") or {}).get("containerStatuses") or []:
        done = (c.get("state") or {}).get("terminated") or {}
        try:
            starts.append(datetime.fromisoformat(done["startedAt"].replace("Z", "+00:00")).timestamp())
            ends.append(datetime.fromisoformat(done["finishedAt"].replace("Z", "+00:00")).timestamp())
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
    return max(ends) - min(starts) if starts else None


class Watcher:
    """`fairgpu record`: the cluster as fairgpu's engine would take it in, recorded from its watches without
    scheduling anything (from a workstation, beside the scheduler that decides). Our pods form workloads as
    the controller forms them (each user's members of a pod group as one); a workload runs once a member is
    bound, ends when its pods are gone or have exited. A running workload whose pods are deleted rather than
    exit is recorded as evicted (the replay decides its own evictions; this keeps a recreated pod the same workload)."""

    def __init__(
        self,
        port: KubePort,
        writer: TraceWriter,
        scheduler_name: str = "fairgpu",
        clock: Callable[[], float] = time.time,
        rules: GpuRules = DEFAULT_RULES,
    ) -> None:
        self.recorder = Recorder(writer, "record", scheduler_name)
        self.scheduler_name, self.clock, self.rules = scheduler_name, clock, rules
        self.times = PodTimes(clock, scheduler_name)
        self.wake = asyncio.Event()
        self.nodes = Informer(port, NODES, self._inputs)
        self.queues = Informer(port, QUEUES, self._inputs)
        self.pods = Informer(port, PODS, lambda kind, obj: self.wake.set())
        self.times.attach(self.pods)
        self._parsed_nodes = ParsedNodes()
        self._node_specs: list[NodeSpec] = []
        self._queue_specs: list[QueueSpec] = []
        self._queue_map = queue_map(())
        self._stale = True  # nodes or queues changed since they were last read
        self._leaving: set[str] = set()  # workloads whose eviction is recorded
        self._running: dict[str, list[tuple[str, str]]] = {}  # running workload → its pods (key, uid), last look

    def _inputs(self, kind: str, obj: dict) -> None:
        self._stale = True
        self.wake.set()

    async def run(self, min_interval: float = 0.05) -> None:
        informers = [asyncio.create_task(i.run()) for i in (self.nodes, self.queues, self.pods)]
        try:
            await asyncio.gather(*(i.synced.wait() for i in (self.nodes, self.queues, self.pods)))
            while True:
                await self.wake.wait()
                self.wake.clear()
                self.observe(self.clock())
                await asyncio.sleep(min_interval)  # let a burst of events land first
        finally:
            for t in informers:
                t.cancel()
            await asyncio.gather(*informers, return_exceptions=True)

    def observe(self, now: float) -> None:
        if self._stale:
            specs = self._parsed_nodes.read(self.nodes.cache)
            if specs != self._node_specs:
                self._node_specs = specs
            entries, _ = queue_entries(self.queues.cache.values())
            queues = [e.spec for e in entries]
            if [queue_doc(q) for q in queues] != [queue_doc(q) for q in self._queue_specs]:
                self._queue_specs = queues
            self._queue_map = queue_map(entries)
            self._stale = False
        ours: list[PodInfo] = []
        for obj in self.pods.cache.values():
            if (obj.get("spec") or {}).get("schedulerName") != self.scheduler_name:
                continue
            try:
                p = pod_info(obj, self.rules)
            except ValueError:
                continue  # the scheduler says why on the pod; it never runs as ours
            if not p.terminal and p.problem is None and not p.gated:  # the controller leaves gated pods alone
                ours.append(p)
        members = _named(by_workload(ours))
        workloads: dict[str, Workload] = {}
        running, evictions = [], []
        for name, pods in members.items():
            queue, _ = queue_for(pods[0], self._queue_map)
            bound = any(m.node for m in pods)
            if queue is None or (not bound and len(pods) < max(m.min_members for m in pods)):
                continue  # no queue, or a gang not whole yet: the controller waits for it too
            workloads[name] = workload_of(name, queue, pods)
            if bound:
                running.append(name)
                if any(m.deleting for m in pods) and name not in self._leaving:
                    self._leaving.add(name)
                    evictions.append(Evict(name, "deleted while running"))
        self._leaving &= workloads.keys()
        # Stopped running (gone, or waiting again under its name) with no pod of it seen to exit: deleted (an
        # eviction with no grace period shows only as that).
        cache, now_running = self.pods.cache, set(running)

        def exited(key: str, uid: str) -> bool:
            obj = cache.get(key)
            return obj is not None and obj["metadata"].get("uid") == uid and pod_info(obj).terminal

        deleted = [
            name
            for name, pods in self._running.items()
            if name not in now_running and not any(exited(key, uid) for key, uid in pods)
        ]
        self._running = {name: [(m.key, m.uid) for m in members[name]] for name in running}

        def placed_on(name: str) -> list[str]:
            return [m.node for m in members[name] if m.node]

        def started_at(name: str) -> float:
            return min(m.started for m in members[name] if m.node)

        pending = [n for n in workloads if n not in now_running]
        seen = Seen(self._node_specs, self._queue_specs, pending, running, workloads.__getitem__, placed_on, started_at)
        seen.evictions, seen.ran, seen.deleted = evictions, self.times.run_length, deleted
        self.recorder.observe(now, seen)


def _named(groups: dict[tuple[str, str], list[PodInfo]]) -> dict[str, list[PodInfo]]:
    """One name per workload. Where several users' pods share a group, the user of its oldest pod keeps the
    group's name (a pod joining later renames nothing that runs) and the others are named after their first
    member, as the controller names a second gang of a group."""
    out: dict[str, list[PodInfo]] = {}
    oldest = sorted(groups.items(), key=lambda kv: min((m.created, m.name) for m in kv[1]))
    for (name, _), pods in oldest:
        pods.sort(key=lambda m: m.name)
        out[f"{name}/{pods[0].name}" if name in out else name] = pods
    return out
