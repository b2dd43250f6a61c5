"""One engine, two drivers, and the twin between them: one scenario runs through the live controller against
the fake apiserver (its kubelet completing pods at their expected runtimes on a logical clock that moves from
event to event whenever the cluster is quiet, tests/logical_clock.py: six simulated hours in a few seconds,
whatever the machine's load) and through the simulator; per-queue GPU-hours agree within 2 %, the same
workloads are preempted and the gangs start in the same order. The trace the controller recorded, replayed
in the simulator, gives the same figures again.

The scenario: two 8-GPU nodes; team-c is guaranteed 8 GPUs and reclaims them from team-b's borrowed ones;
team-a weighs 3 against team-b's 1; a Job-like controller recreates an evicted pod under its name, as the
simulator requeues evicted work."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from fairgpu.catalog import load_profile
from fairgpu.errors import KubeError
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.informer import Informer
from fairgpu.k8s.port import NODES, PODS, QUEUES
from fairgpu.k8s.recording import PodTimes, Watcher
from fairgpu.k8s.translate import EXPECTED_RUNTIME, MIN_MEMBERS, POD_GROUP, node_spec, pod_info
from fairgpu.model import Workload
from fairgpu.sim.recorded import read_fairgpu
from fairgpu.sim.runner import SimResult, Simulation
from fairgpu.sim.scenario import Scenario
from fairgpu.spec import QueueDoc
from fairgpu.twin.recorder import EngineRecorder, Recorder
from fairgpu.twin.writer import TraceWriter
from fake_kubelet import FakeNodes
from logical_clock import LogicalClock, Quiet, drive
from test_live_scheduling import node, pod, until

MINUTE = 60.0
WALL_LIMIT = 60.0  # real seconds a live run may take (about five unloaded)
TOLERANCE = 0.02


@dataclass(frozen=True)
class Job:
    at: float  # minutes after the start
    ns: str
    name: str
    gpus: int  # per pod
    minutes: float  # run time
    members: int = 1  # a gang when more than one

    @property
    def workload(self) -> str:
        return f"{self.ns}/group:{self.name}" if self.members > 1 else f"{self.ns}/{self.name}"

    def manifests(self) -> list[dict]:
        out = []
        for i in range(self.members):
            name = f"{self.name}-{i}" if self.members > 1 else self.name
            labels = {"job": self.name} | (
                {POD_GROUP: self.name, MIN_MEMBERS: str(self.members)} if self.members > 1 else {}
            )
            obj = pod(self.ns, name, {"nvidia.com/gpu": str(self.gpus)}, labels)
            obj["metadata"]["annotations"] = {EXPECTED_RUNTIME: f"{self.minutes * MINUTE:g}s"}
            out.append(obj)
        return out


TEAMS = [
    {"name": "team-a", "weight": 3, "namespaces": ["a"]},
    {"name": "team-b", "weight": 1, "namespaces": ["b"]},
    {"name": "team-c", "guaranteed": {"nvidia.com/gpu": 8}, "namespaces": ["c"]},
]
JOBS = [
    *(Job(2 * i, "b", f"b-{i}", 2, 40) for i in range(6)),  # b borrows 12 GPUs, one job every 2 minutes
    Job(1, "a", "train", 2, 50, members=2),
    Job(15, "c", "big", 2, 30, members=4),  # c reclaims its 8: b's four youngest jobs are evicted
    Job(20, "a", "eval", 2, 20, members=2),
    *(Job(25 + i, "a", f"a-{i}", 1, 30) for i in range(2)),
    Job(70, "c", "tune", 1, 20, members=2),  # 25 minutes after eval starts: no race with it
]


def queue_specs(teams: list[dict]) -> list:
    return [QueueDoc.model_validate({k: v for k, v in q.items() if k != "namespaces"}).to_spec() for q in teams]


def scenario(jobs: list[Job] = JOBS, teams: list[dict] = TEAMS) -> Scenario:
    """The same cluster, queues and jobs for the simulator, read by the controller's own translation."""
    queues = queue_specs(teams)
    workloads = [
        Workload(
            job.workload,
            f"team-{job.ns}",
            tuple(pod_info(m).spec for m in job.manifests()),
            submit_time=job.at * MINUTE,
            duration=job.minutes * MINUTE,
        )
        for job in sorted(jobs, key=lambda j: j.at)
    ]
    return Scenario("parity", 6 * 3600.0, [node_spec(node(i)) for i in range(2)], queues, workloads)


@dataclass
class Figures:
    gpu_hours: dict[str, float]
    preempted: set[str]
    gang_order: list[str]


def sim_figures(res: SimResult, jobs: list[Job] = JOBS) -> Figures:
    gangs = {j.workload for j in jobs if j.members > 1}
    order = sorted((w["first_start_s"], w["workload"]) for w in res.workloads if w["workload"] in gangs)
    return Figures(
        {q: v["gpu_hours"] for q, v in res.queues.items()},
        {name for _, name, _ in res.eviction_log},
        [name for _, name in order],
    )


class Requeue:
    """What a Job or StatefulSet does for an evicted pod: a new pod of the same name and spec."""

    def __init__(self, port: KubeClient, manifests: dict[str, dict]) -> None:
        self.port, self.manifests = port, manifests
        self.informer = Informer(port, PODS, self._event)
        self.tasks: set[asyncio.Task] = set()
        self.finished: set[str] = set()  # pods that succeeded (and may be deleted since)

    def _event(self, kind: str, obj: dict) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if (obj.get("status") or {}).get("phase") == "Succeeded":
            self.finished.add(key)
        elif kind == "DELETED":
            task = asyncio.create_task(self.port.create(PODS, self.manifests[key], obj["metadata"]["namespace"]))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)


class PodGC:
    """The pod garbage collector: a node deleted, the pods bound to it are deleted at once (`deleted`: those
    that had not finished)."""

    def __init__(self, port: KubeClient, pods: Informer) -> None:
        self.port, self.pods = port, pods
        self.informer = Informer(port, NODES, self._event)
        self.tasks: set[asyncio.Task] = set()
        self.deleted: set[str] = set()

    def _event(self, kind: str, obj: dict) -> None:
        if kind != "DELETED":
            return
        for key, pod_obj in list(self.pods.cache.items()):
            if pod_obj["spec"].get("nodeName") == obj["metadata"]["name"]:
                if (pod_obj.get("status") or {}).get("phase") != "Succeeded":
                    self.deleted.add(key)
                ns, name = key.split("/", 1)
                task = asyncio.create_task(self._delete(name, ns))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _delete(self, name: str, ns: str) -> None:
        with contextlib.suppress(KubeError):  # gone already
            await self.port.delete(PODS, name, ns, grace_seconds=0)


Action = tuple[float, Callable[[KubeClient], Awaitable[object]]]  # (minute, what is done to the cluster)


def run_live(
    fake_api, tmp_path: Path, jobs: list[Job] = JOBS, teams: list[dict] = TEAMS, actions: list[Action] = ()
) -> tuple[Figures, Path, Path]:
    """The live run: (figures, the trace `run --record` wrote, the one `fairgpu record` wrote beside it).
    `actions` change the cluster at their minutes (a node deleted, a queue edited, a budget created)."""
    trace, watched = tmp_path / "trace.jsonl", tmp_path / "watched.jsonl"
    manifests = {f"{m['metadata']['namespace']}/{m['metadata']['name']}": m for j in jobs for m in j.manifests()}
    workload_of = {key: j.workload for j in jobs for key in manifests if key.startswith(f"{j.ns}/{j.name}")}

    async def go() -> Figures:
        clock = LogicalClock()
        fake_api.api.store.clock = clock  # creation and deletion timestamps on the same clock
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        for i in range(2):
            await port.create(NODES, node(i))
        for q in teams:
            spec = {k: v for k, v in q.items() if k != "name"}
            await port.create(QUEUES, {"metadata": {"name": q["name"]}, "spec": spec})
        kubelet = FakeNodes(port, clock, complete=True, sleep_until=clock.sleep_until)
        requeue = Requeue(port, manifests)
        gc = PodGC(port, requeue.informer)
        writer = TraceWriter(trace)
        ctl = Controller(port, load_profile("fairgpu"), clock=clock)
        times = PodTimes(clock, "fairgpu")  # wired as `fairgpu run --record` wires it (k8s/app.py)
        times.attach(ctl.pods)
        ctl.observer = EngineRecorder(Recorder(writer, "run", "fairgpu", "fairgpu"), times.run_length)
        outside = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc2")))  # a workstation's
        watcher = Watcher(outside, TraceWriter(watched), clock=clock)
        stepping, submitting = [False], [False]
        step = ctl.step

        async def step_marked() -> None:  # the controller is busy while a pass runs
            stepping[0] = True
            try:
                await step()
            finally:
                stepping[0] = False

        ctl.step = step_marked  # type: ignore[method-assign]
        clock.on_move.append(ctl.wake.set)  # a cycle at every instant, as the simulator runs one
        informers = [ctl.pods, ctl.nodes, ctl.queues, kubelet.informer, requeue.informer, gc.informer]
        quiet = Quiet(
            fake_api,
            [*informers, watcher.pods, watcher.nodes, watcher.queues],
            [
                lambda: not stepping[0] and not ctl.wake.is_set() and ctl.carry.quiet() and not ctl.carry._tasks,
                kubelet.idle,
                lambda: not requeue.tasks and not gc.tasks and not watcher.wake.is_set() and not submitting[0],
            ],
        )
        runs = (kubelet.run(), requeue.informer.run(), gc.informer.run(), ctl.run(), watcher.run())
        tasks = [asyncio.create_task(t) for t in runs]
        try:
            await until(lambda: ctl.stats.cycles > 0 and watcher.pods.synced.is_set(), 10, "the first cycle")
            tasks.append(asyncio.create_task(drive(clock, quiet)))
            t0 = clock()
            timeline = [(job.at, 0, job) for job in jobs] + [(at, 1, act) for at, act in actions]
            for at, _, what in sorted(timeline, key=lambda e: (e[0], e[1])):
                await clock.sleep_until(t0 + at * MINUTE)
                submitting[0] = True  # the clock waits for what is done at this instant
                if isinstance(what, Job):
                    # a gang's pods arrive together, as in the simulator (one by one, its start waits for the last)
                    await asyncio.gather(*(port.create(PODS, m, what.ns) for m in what.manifests()))
                else:
                    await what(port)
                submitting[0] = False

            def done() -> bool:
                return requeue.finished >= manifests.keys()

            await until(done, WALL_LIMIT, "every job to run to completion")
            assert not kubelet.violations, kubelet.violations
            state = fake_api.control("state")
            evicted = {workload_of[f"{e['namespace']}/{e['name']}"] for e in state["evictions"] if e["code"] < 300}
            evicted |= {workload_of[key] for key in gc.deleted}
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            writer.close()
            watcher.recorder.close()
            await port.close()
            await outside.close()
        hours: dict[str, float] = {q["name"]: 0.0 for q in teams}
        for key, runs in kubelet.runs.items():
            gpus = pod_info(manifests[key]).spec.gpu.count
            hours[f"team-{key.split('/')[0]}"] += sum(gpus * (end - start) for start, end in runs) / 3600
        gang_start = {}
        for j in jobs:
            if j.members > 1:
                members = [kubelet.runs[f"{j.ns}/{j.name}-{i}"][0][0] for i in range(j.members)]
                gang_start[j.workload] = max(members)
        return Figures(hours, evicted, sorted(gang_start, key=gang_start.get))

    return asyncio.run(asyncio.wait_for(go(), 2 * WALL_LIMIT)), trace, watched


def test_live_simulated_and_replayed_runs_agree(fake_api, tmp_path):
    profile = load_profile("fairgpu")
    sim = Simulation(scenario(), profile).run()
    simulated = sim_figures(sim)
    live, trace, watched = run_live(fake_api, tmp_path)
    recorded = read_fairgpu(trace)
    replay = sim_figures(Simulation(recorded.scenario, profile, horizon=6 * 3600.0).run())
    passive = read_fairgpu(watched)  # `fairgpu record` names no profile: the replay is told which
    assert passive.profile == "" and len(passive.scenario.workloads) == len(JOBS)
    rewatched = sim_figures(Simulation(passive.scenario, profile, horizon=6 * 3600.0).run())

    runs = {"live": live, "simulated": simulated, "replayed": replay, "replayed (record)": rewatched}
    print("\nGPU-hours " + "".join(f"{k:>19}" for k in runs))
    for q in simulated.gpu_hours:
        print(f"{q:10}" + "".join(f"{f.gpu_hours[q]:19.3f}" for f in runs.values()))
    for k, f in runs.items():
        print(f"{k}: preempted {sorted(f.preempted)}, gangs in order {f.gang_order}")

    assert all(v["completed"] == v["submitted"] for v in sim.queues.values())  # the scenario runs to its end
    assert simulated.preempted, "the scenario must preempt, or the check proves nothing"
    for q, hours in simulated.gpu_hours.items():
        assert abs(live.gpu_hours[q] - hours) <= TOLERANCE * hours, (q, live.gpu_hours[q], hours)
        for again in (replay, rewatched):
            assert abs(again.gpu_hours[q] - live.gpu_hours[q]) <= TOLERANCE * live.gpu_hours[q], q
    assert live.preempted == simulated.preempted == replay.preempted == rewatched.preempted
    assert live.gang_order == simulated.gang_order == replay.gang_order == rewatched.gang_order
