"""One engine, two drivers, and the twin between them: one scenario runs through the live controller against
the fake apiserver (its kubelet completing pods at their expected runtimes on a clock that runs a simulated
hour in ten seconds) and through the simulator; per-queue GPU-hours agree within 2 %, the same workloads
are preempted and the gangs start in the same order. The trace the controller recorded, replayed in the
simulator, gives the same figures again.

The scenario: two 8-GPU nodes; team-c is guaranteed 8 GPUs and reclaims them from team-b's borrowed ones;
team-a weighs 3 against team-b's 1; a Job-like controller recreates an evicted pod under its name, as the
simulator requeues evicted work."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from fairgpu.catalog import load_profile
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
from test_live_scheduling import node, pod, until

SCALE = 360.0  # simulated seconds per real second: an hour in ten seconds
MINUTE = 60.0
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
            labels = {POD_GROUP: self.name, MIN_MEMBERS: str(self.members)} if self.members > 1 else {}
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


def scenario() -> Scenario:
    """The same cluster, queues and jobs for the simulator, read by the controller's own translation."""
    queues = [QueueDoc.model_validate({k: v for k, v in q.items() if k != "namespaces"}).to_spec() for q in TEAMS]
    workloads = [
        Workload(
            job.workload,
            f"team-{job.ns}",
            tuple(pod_info(m).spec for m in job.manifests()),
            submit_time=job.at * MINUTE,
            duration=job.minutes * MINUTE,
        )
        for job in sorted(JOBS, key=lambda j: j.at)
    ]
    return Scenario("parity", 6 * 3600.0, [node_spec(node(i)) for i in range(2)], queues, workloads)


@dataclass
class Figures:
    gpu_hours: dict[str, float]
    preempted: set[str]
    gang_order: list[str]


def sim_figures(res: SimResult) -> Figures:
    gangs = {j.workload for j in JOBS if j.members > 1}
    order = sorted((t, name) for name, t in res.starts.items() if name in gangs)
    return Figures(
        {q: v["gpu_hours"] for q, v in res.queues.items()},
        {name for _, name, _ in res.eviction_log},
        [name for _, name in order],
    )


class ScaledClock:
    """Unix time that runs SCALE times faster than the wall clock from the moment it is made."""

    def __init__(self, scale: float) -> None:
        self.scale, self.origin, self.real = scale, time.time(), time.monotonic()

    def __call__(self) -> float:
        return self.origin + (time.monotonic() - self.real) * self.scale

    async def sleep_until(self, t: float) -> None:
        await asyncio.sleep(max(0.0, (t - self()) / self.scale))


class Requeue:
    """What a Job or StatefulSet does for an evicted pod: a new pod of the same name and spec."""

    def __init__(self, port: KubeClient, manifests: dict[str, dict]) -> None:
        self.port, self.manifests = port, manifests
        self.informer = Informer(port, PODS, self._event)
        self.tasks: set[asyncio.Task] = set()

    def _event(self, kind: str, obj: dict) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if kind == "DELETED" and (obj.get("status") or {}).get("phase") != "Succeeded":
            task = asyncio.create_task(self.port.create(PODS, self.manifests[key], obj["metadata"]["namespace"]))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)


def run_live(fake_api, tmp_path: Path) -> tuple[Figures, Path, Path]:
    """The live run: (figures, the trace `run --record` wrote, the one `fairgpu record` wrote beside it)."""
    trace, watched = tmp_path / "trace.jsonl", tmp_path / "watched.jsonl"
    manifests = {f"{m['metadata']['namespace']}/{m['metadata']['name']}": m for j in JOBS for m in j.manifests()}
    workload_of = {key: j.workload for j in JOBS for key in manifests if key.startswith(f"{j.ns}/{j.name}")}

    async def go() -> Figures:
        clock = ScaledClock(SCALE)
        fake_api.api.store.clock = clock  # creation and deletion timestamps on the same clock
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        for i in range(2):
            await port.create(NODES, node(i))
        for q in TEAMS:
            spec = {k: v for k, v in q.items() if k != "name"}
            await port.create(QUEUES, {"metadata": {"name": q["name"]}, "spec": spec})
        kubelet = FakeNodes(port, clock, SCALE, complete=True)
        requeue = Requeue(port, manifests)
        writer = TraceWriter(trace)
        ctl = Controller(port, load_profile("fairgpu"), clock=clock)
        times = PodTimes(clock, "fairgpu")  # wired as `fairgpu run --record` wires it (k8s/app.py)
        times.attach(ctl.pods)
        ctl.observer = EngineRecorder(Recorder(writer, "run", "fairgpu", "fairgpu"), times.run_length)
        outside = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc2")))  # a workstation's
        watcher = Watcher(outside, TraceWriter(watched), clock=clock)
        runs = (kubelet.run(), requeue.informer.run(), ctl.run(), watcher.run())
        tasks = [asyncio.create_task(t) for t in runs]
        try:
            await until(lambda: ctl.stats.cycles > 0, 10, "the controller's first cycle")
            t0 = clock()
            for job in sorted(JOBS, key=lambda j: j.at):
                await clock.sleep_until(t0 + job.at * MINUTE)
                # a gang's pods arrive together, as in the simulator (one at a time, its start waits for the last)
                await asyncio.gather(*(port.create(PODS, m, job.ns) for m in job.manifests()))

            def done() -> bool:
                phases = [(kubelet.informer.cache.get(k) or {}).get("status", {}).get("phase") for k in manifests]
                return all(p == "Succeeded" for p in phases)

            await until(done, 6 * 3600 / SCALE, "every job to run to completion")
            assert not kubelet.violations, kubelet.violations
            evicted = {workload_of[f"{e['namespace']}/{e['name']}"] for e in fake_api.control("state")["evictions"]}
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            writer.close()
            watcher.recorder.close()
            await port.close()
            await outside.close()
        hours: dict[str, float] = {f"team-{ns}": 0.0 for ns in "abc"}
        for key, runs in kubelet.runs.items():
            gpus = pod_info(manifests[key]).spec.gpu.count
            hours[f"team-{key.split('/')[0]}"] += sum(gpus * (end - start) for start, end in runs) / 3600
        gang_start = {}
        for j in JOBS:
            if j.members > 1:
                members = [kubelet.runs[f"{j.ns}/{j.name}-{i}"][0][0] for i in range(j.members)]
                gang_start[j.workload] = max(members)
        return Figures(hours, evicted, sorted(gang_start, key=gang_start.get))

    return asyncio.run(asyncio.wait_for(go(), 60)), trace, watched


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
