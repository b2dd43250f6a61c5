"""A pod group over the wire: it waits, saying why, until min-members of its pods exist, then its pods are
bound together — none of them before, and never a part of the gang alone."""

from __future__ import annotations

import asyncio

from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from test_live_scheduling import node, pod, stop, until

GANG = {"fairgpu.io/pod-group": "train", "fairgpu.io/min-members": "4"}


def test_a_gang_waits_for_its_min_members_then_binds_together(fake_api, tmp_path):
    fake_api.control("device-plugin")

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
        for i in range(3):  # three of the four members: they would fit (6 of 8 GPUs), but must not start
            await port.create(PODS, pod("a", f"w{i}", {"nvidia.com/gpu": "2"}, GANG), "a")
        await port.create(NODES, node(1))
        await port.create(PODS, pod("a", "solo", {"nvidia.com/gpu": "1"}), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        ctl.retry_every = 0.2
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 20, "the solo pod to be bound")

            async def said() -> dict[str, str]:
                items, _ = await port.list(PODS, "a")
                return {
                    p["metadata"]["name"]: c.get("message", "")
                    for p in items
                    for c in (p.get("status") or {}).get("conditions") or []
                    if c["type"] == "PodScheduled" and c["status"] == "False"
                }

            loop = asyncio.get_running_loop()
            end = loop.time() + 10
            while len(waiting := await said()) < 3:
                assert loop.time() < end, waiting
                await asyncio.sleep(0.05)
            assert all("gang train: 3 of 4 members exist" in waiting[f"w{i}"] for i in range(3)), waiting
            await asyncio.sleep(4 * ctl.retry_every)  # several retries later it still waits
            items, _ = await port.list(PODS, "a")
            assert [p["metadata"]["name"] for p in items if p["spec"].get("nodeName")] == ["solo"]

            await port.create(PODS, pod("a", "w3", {"nvidia.com/gpu": "2"}, GANG), "a")
            await until(lambda: ctl.stats.binds == 5 and not ctl.inflight, 20, "the gang to be bound")
            items, _ = await port.list(PODS, "a")
            assert all(p["spec"].get("nodeName") for p in items)
            assert len(ctl.engine.running) == 2  # the solo pod, and the gang as one workload
            assert "a/group:train" in ctl.engine.running
        finally:
            await stop(port, run)

    asyncio.run(asyncio.wait_for(go(), 60))
