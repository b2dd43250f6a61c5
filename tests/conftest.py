"""Small builders shared by the engine tests."""

from __future__ import annotations

import pytest

from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload


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


TENANTS = ("a", "b", "c", "x", "fairgpu-system")  # the tenant namespaces the tests' cluster has


@pytest.fixture
def fake_api():
    """A fresh wire-level fake kube-apiserver on 127.0.0.1 (tests/fakeapi)."""
    from fakeapi.server import FakeApiServer

    server = FakeApiServer(namespaces=TENANTS).start()
    yield server
    server.stop()
