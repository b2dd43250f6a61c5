"""A pod deleted and made again under its name (a StatefulSet's, a Job's retry) between two controller passes
is another pod: what the first held is released and the new one is scheduled. Before, the controller took it
for the pod it held: the deleted pod's GPUs stayed booked and the new pod waited forever."""

from __future__ import annotations

import asyncio

from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from fake_kubelet import FakeNodes
from test_live_scheduling import node, pod, until


def test_a_pod_made_again_under_its_name_is_scheduled_afresh(fake_api, tmp_path):
    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        await port.create(QUEUES, {"metadata": {"name": "team-a"}, "spec": {"namespaces": ["a"]}})
        kubelet = FakeNodes(port)
        ctl = Controller(port, load_profile("fairgpu"))
        # The informers run, the controller's passes are taken by hand: both changes land in one pass.
        tasks = [asyncio.create_task(t) for t in (kubelet.run(), ctl.nodes.run(), ctl.pods.run(), ctl.queues.run())]
        try:
            await until(ctl.synced, 10, "the caches")
            await port.create(PODS, pod("a", "p", {"nvidia.com/gpu": "4"}), "a")
            await until(lambda: "a/p" in ctl.pods.cache, 10, "the pod in the cache")
            await ctl.step()
            cache = ctl.pods.cache
            await until(lambda: (cache["a/p"].get("status") or {}).get("phase") == "Running", 10, "p to run")
            await ctl.step()
            first = cache["a/p"]["metadata"]["uid"]
            await port.delete(PODS, "p", "a", grace_seconds=0)
            await port.create(PODS, pod("a", "p", {"nvidia.com/gpu": "8"}), "a")  # the whole node, this time
            await until(lambda: "a/p" in cache and cache["a/p"]["metadata"]["uid"] != first, 10, "the new pod")
            for _ in range(3):
                await ctl.step()
                await asyncio.sleep(0.2)
            await until(lambda: cache["a/p"]["spec"].get("nodeName") == "node-00", 10, "the new pod to be bound")
            assert (
                ctl.engine.state.allocated_gpu_equivalents() == 8
            )  # the old pod's 4 GPUs were released, not booked twice
            assert not kubelet.violations, kubelet.violations
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await ctl.carry.close()
            await port.close()

    asyncio.run(asyncio.wait_for(go(), 60))
