"""Live, a queue learns how long its work runs from the pods that succeed — not from those deleted early."""

from __future__ import annotations

import asyncio

from fairgpu.catalog import load_profile
from fairgpu.framework.durations import MARGIN, MIN_SAMPLES
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from test_live_scheduling import node, pod, stop, until


def test_succeeded_pods_teach_their_queue_its_run_time_and_deleted_ones_do_not(fake_api, tmp_path):
    fake_api.control("device-plugin")
    now = [1000.0]

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        await port.create(NODES, node(1))
        await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
        names = [f"j{i}" for i in range(MIN_SAMPLES + 1)]
        for name in names:
            await port.create(PODS, pod("a", name, {"nvidia.com/gpu": "1"}), "a")
        ctl = Controller(port, load_profile("fairgpu"), clock=lambda: now[0])
        ctl.retry_every = 0.2
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == len(names) and not ctl.inflight, 20, "every pod to be bound")
            q = ctl.engine.tree.index["q"]
            now[0] += 600.0  # ten minutes later: one is deleted (that says nothing), the others succeed
            await port.delete(PODS, names[0], "a")
            for name in names[1:-1]:
                await port.patch(PODS, name, {"status": {"phase": "Succeeded"}}, "a", subresource="status")
            await until(lambda: len(ctl.engine.running) == 1, 20, "the finished pods to be let go")
            assert ctl.engine.durations.learned(q) is None  # MIN_SAMPLES - 1 runs: the deleted one not counted
            await port.patch(PODS, names[-1], {"status": {"phase": "Succeeded"}}, "a", subresource="status")
            await until(lambda: not ctl.engine.running, 20, "the last pod to be let go")
            assert ctl.engine.durations.learned(q) == 600.0 * MARGIN
        finally:
            await stop(port, run)

    asyncio.run(asyncio.wait_for(go(), 60))
