"""A cancelled controller or elector stops, even when the wait it is parked in ends at that very moment.

Python 3.11's `asyncio.wait_for` returns the inner result when a cancellation and the inner completion
meet, and the cancellation is lost. bench/soak.py seed 5 hung that way: a leader's controller was
cancelled as its wake event fired, went on as a standby waiting to lead again, and `_stop` waited for it
forever. These tests make the two events meet on purpose."""

from __future__ import annotations

import asyncio

from chaos import chaos_node, chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.port import NODES, PODS, QUEUES
from test_live_scheduling import until

ONE = {"nvidia.com/gpu": "1"}


async def cancel_as_it_wakes(task: asyncio.Task, wake: asyncio.Event) -> bool:
    """Wake the task's wait and cancel the task in the same turn of the loop; True when it stopped."""
    wake.set()
    await asyncio.sleep(0)  # the inner wait finishes; the task has not resumed yet
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=3.0)
    if not done:  # the cancellation was lost: stop it for good before failing
        task.cancel()
        await asyncio.wait({task}, timeout=3.0)
    return bool(done)


def test_a_controller_cancelled_as_its_wake_fires_stops(fake_api, tmp_path):
    """One GPU, two pods: one binds, the other waits, so the controller parks in its timed wait for news."""
    fake_api.control("device-plugin")

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, chaos_node(0, 1))
        await port.create(QUEUES, {"metadata": {"name": "q-a"}, "spec": {"namespaces": ["a"]}})
        for i in range(2):
            await port.create(PODS, chaos_pod("a", f"p{i}", ONE), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        ctl.retry_every = 30.0  # parked in the timed wait for the whole test
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "the first pod to bind")
            await asyncio.sleep(0.3)
            assert ctl.engine is not None and ctl.engine.pending
            assert await cancel_as_it_wakes(run, ctl.wake), "the controller went on after its cancellation"
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await port.close()

    asyncio.run(asyncio.wait_for(go(), 60))


class HeldElector(LeaderElector):
    """An elector whose every acquisition or renewal succeeds when `gate` is set."""

    def __init__(self) -> None:
        super().__init__(None, "ns", "lease", "me", 15.0, 5.0, 10.0)  # type: ignore[arg-type]
        self.gate = asyncio.Event()

    async def try_acquire_or_renew(self) -> bool:
        await self.gate.wait()
        return True


def test_an_elector_cancelled_as_its_renewal_lands_stops_and_steps_down():
    async def go() -> None:
        elector = HeldElector()
        run = asyncio.create_task(elector.run())
        await asyncio.sleep(0.05)
        stopped = await cancel_as_it_wakes(run, elector.gate)
        assert stopped, "the elector went on renewing after its cancellation"
        assert not elector.leading.is_set()

    asyncio.run(asyncio.wait_for(go(), 30))
