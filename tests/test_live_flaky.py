"""Session 13 (safe9): what a flaky network (a watch that stalls, then replays a burst) or a quick owner can make
land between two controller passes never strands a pod nor leaves a GPU booked for a pod that is not there."""

from __future__ import annotations

import asyncio

from chaos import chaos_node, chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from live_setup import ONE
from test_live_scheduling import until


def test_a_pod_made_again_after_our_bind_landed_unseen_is_scheduled_afresh(fake_api, tmp_path):
    """Our Binding of a/p lands; before a pass sees it bound (a stalled watch replays its events in one burst),
    a/p is deleted and made again. Before: the pass took the new pending pod for the one whose bind had landed
    (landed binds were known by name), adopted it as running where the old one was bound, and never scheduled
    it; the landed mark was never cleared, so a changed inventory (node-001 added) waited for it for ever: no
    pod was read or placed again. Now a landed bind is known by the pod's UID: the new pod is scheduled."""
    fake_api.control("device-plugin")

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, chaos_node(0, 1))
        await port.create(QUEUES, {"metadata": {"name": "q-a"}, "spec": {"namespaces": ["a"]}})
        ctl = Controller(port, load_profile("fairgpu"))
        # The informers run; the controller's passes are taken by hand, so the changes land between two of them.
        tasks = [asyncio.create_task(t) for t in (ctl.nodes.run(), ctl.pods.run(), ctl.queues.run())]
        try:
            await until(ctl.synced, 10, "the caches")
            await port.create(PODS, chaos_pod("a", "p", ONE), "a")
            await until(lambda: "a/p" in ctl.pods.cache, 10, "the pod in the cache")
            await ctl.step()
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "p's bind")
            first = ctl.pods.cache["a/p"]["metadata"]["uid"]
            await port.delete(PODS, "p", "a", grace_seconds=0)
            await port.create(PODS, chaos_pod("a", "p", ONE), "a")
            cache = ctl.pods.cache
            await until(lambda: "a/p" in cache and cache["a/p"]["metadata"]["uid"] != first, 10, "the new pod")
            await port.create(NODES, chaos_node(1, 1))
            await until(lambda: "/node-001" in ctl.nodes.cache, 10, "the new node")
            for _ in range(20):
                await ctl.step()
                if cache["a/p"]["spec"].get("nodeName"):
                    break
                await asyncio.sleep(0.05)
            assert len(ctl.engine.state.node_names) == 2, "the new node never reached the engine"
            assert cache["a/p"]["spec"].get("nodeName"), "the new pod was never scheduled"
            assert ctl.engine.state.allocated_gpu_equivalents() == 1  # the old pod's GPU is not booked too
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await ctl.carry.close()
            await port.close()

    asyncio.run(asyncio.wait_for(go(), 30))
