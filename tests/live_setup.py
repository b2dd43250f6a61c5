"""The small cluster the live safety tests start from (chaos's nodes, a queue per tenant), a replica on it,
and a read of the fake's pods."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from chaos import chaos_node
from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, QUEUES

E = TypeVar("E")

GANG = {"fairgpu.io/pod-group": "g", "fairgpu.io/min-members": "2"}
ONE = {"nvidia.com/gpu": "1"}
TINY = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "5", "nvidia.com/gpumem": "100"}


async def setup(port, nodes: int, gpus: int, tenants: tuple[str, ...] = ("a", "b")) -> None:
    for i in range(nodes):
        await port.create(NODES, chaos_node(i, gpus))
    for t in tenants:
        await port.create(QUEUES, {"metadata": {"name": f"q-{t}"}, "spec": {"namespaces": [t]}})


async def replica(
    kubeconfig: str, ident: str, elect: Callable[[KubeClient], E], **kw
) -> tuple[E, Controller, KubeClient]:
    """One replica: its own client (named `fairgpu/IDENT` in the fake's log), its elector made on that client by
    `elect`, and a controller led by it (`kw`: more of Controller's arguments)."""
    port = await KubeClient.connect(kubeconfig)
    port.api.user_agent = f"fairgpu/{ident}"
    e = elect(port)
    return e, Controller(port, load_profile("fairgpu"), leadership=e, **kw), port


def pods_now(fake_api) -> dict[str, dict]:
    def read() -> dict[str, dict]:
        return {
            f"{o['metadata']['namespace']}/{o['metadata']['name']}": o
            for o in fake_api.api.store.objects.values()
            if o.get("kind") == "Pod"
        }

    return fake_api.call(read)
