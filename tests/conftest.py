"""Small builders shared by the engine tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache

import pytest
from hypothesis import settings

from fairgpu.catalog import load_profile
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload
from fairgpu.sim.runner import SimResult, simulate
from fairgpu.sim.scenario import load

# bench/mutate.py's workers run the tests with this profile: no example database, since a mutant's failing
# example saved in the scratch copy would fail later, unrelated mutants' property tests and count as their kills
settings.register_profile("mutation", database=None)


@cache
def simulated(scenario: str, profile: str) -> SimResult:
    """A built-in scenario replayed under a built-in profile, once per session: the runs are deterministic,
    the demo alone takes ~30 s of CPU, and several test modules read the same runs."""
    return simulate(load(scenario), load_profile(profile))


def gpu_node(name: str, gpus: int = 8, model: str = "A100-80GB", mem_mib: int = 81920, **kw) -> NodeSpec:
    devices = tuple(GpuDevice(model, mem_mib, uuid=f"GPU-{name}-{j}") for j in range(gpus))
    return NodeSpec(name, kw.pop("cpu_m", 128_000), kw.pop("memory_mib", 1 << 20), devices, **kw)


def whole(count: int = 1, cpu_m: int = 1000, **kw) -> PodSpec:
    return PodSpec(cpu_m=cpu_m, memory_mib=1024, gpu=GpuRequest(count, 100, 0, 100), **kw)


def fraction(cores: int, mem_mib: int, **kw) -> PodSpec:
    return PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, cores, mem_mib), **kw)


def job(name: str, queue: str, pod: PodSpec, pods: int = 1, t: float = 0.0, priority: int = 0) -> Workload:
    return Workload(name, queue, (pod,) * pods, submit_time=t, priority=priority, duration=60.0)


def tree(*names: str, **weights: float) -> QueueTree:
    return QueueTree([QueueSpec(n, weights.get(n, 1.0)) for n in names])


@pytest.fixture
def two_nodes() -> list[NodeSpec]:
    return [gpu_node("n0"), gpu_node("n1")]


TENANTS = ("a", "b", "c", "x", "other", "fairgpu-system")  # the tenant namespaces the tests' cluster has


@pytest.fixture
def fake_api():
    """A fresh wire-level fake kube-apiserver on 127.0.0.1 (tests/fakeapi)."""
    from fakeapi.server import FakeApiServer

    server = FakeApiServer(namespaces=TENANTS).start()
    yield server
    server.stop()


@pytest.fixture
def fake_process():
    """The same fake in a process of its own, for tests that measure the scheduler's timing across it: in this
    process a test's busy loop would slow the fake's answers too (tests/fakeapi/process.py)."""
    from fakeapi.process import FakeProcess

    server = FakeProcess(namespaces=TENANTS).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tls(tmp_path_factory) -> tuple[str, str]:
    """(certificate, key) PEM files of a self-signed certificate for 127.0.0.1."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not available to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    args = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    subprocess.run(
        ["openssl", *args, "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", d / "key.pem", "-out", d / "cert.pem"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(d / "cert.pem"), str(d / "key.pem")


# CI sets FAIRGPU_REQUIRE_ALL=1: a test skipped for a missing prerequisite (../shared/traces, openssl,
# kubectl) then fails, so a machine without them cannot silently drop those checks.
REQUIRE_ALL = os.environ.get("FAIRGPU_REQUIRE_ALL") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"FAIRGPU_REQUIRE_ALL=1 and a prerequisite is missing: {reason}"


def starving_gang_beside_a_stream():
    """Two 2-GPU nodes full of a stream queue's 1-GPU jobs; a 2-pod gang of a queue that starves at once
    arrives at t=1 and, after its cycle, holds nodes as they free."""
    from fairgpu.catalog import load_profile
    from fairgpu.framework.scheduler import Scheduler

    queues = QueueTree([QueueSpec("stream"), QueueSpec("train", starvation_after=0)])
    s = Scheduler([gpu_node("n0", gpus=2), gpu_node("n1", gpus=2)], queues, load_profile("fairgpu"))
    for i in range(4):
        s.submit(job(f"s{i}", "stream", whole(1), t=0))
    s.cycle(0)
    s.submit(job("gang", "train", whole(2), pods=2, t=1))
    s.cycle(1)
    return s
