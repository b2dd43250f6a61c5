"""Issue 11, controller side: the controller never goes blind or waits for ever on its caches: a failing
informer is restarted and /readyz shows it, and a new leader's fresh list survives a failed list."""

from __future__ import annotations

import asyncio

from chaos import chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import PODS
from live_setup import ONE, setup
from test_live_scheduling import stop, until


def test_a_failing_informer_restarts_and_readiness_shows_it(fake_api, tmp_path):
    """Finding 10: an informer's task that dies (a handler's bug) left /readyz green and the controller
    blind. Now the informer is supervised: readiness is False while it fails, it starts over with a fresh
    list, and the pod it failed on is scheduled."""
    fake_api.control("device-plugin")
    failing = {"on": True}

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        ctl = Controller(port, load_profile("fairgpu"))
        handler = ctl.pods.handler

        def flaky(kind: str, obj: dict) -> None:
            if failing["on"] and obj["metadata"]["name"] == "boom":
                raise RuntimeError("handler bug")
            handler(kind, obj)

        ctl.pods.handler = flaky
        run = asyncio.create_task(ctl.run())
        try:
            await until(ctl.synced, 10, "the caches to sync")
            await port.create(PODS, chaos_pod("a", "boom", ONE), "a")
            await until(lambda: not ctl.synced(), 5, "readiness to drop")
            failing["on"] = False
            await until(ctl.synced, 10, "readiness to come back")
            await until(lambda: ctl.stats.binds == 1, 10, "boom to be bound")
        finally:
            await stop(port, run)

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_new_leaders_fresh_list_survives_a_failed_list(fake_api, tmp_path):
    """A new leader waits for a fresh list of pods before deciding. When that list failed (the client's
    five attempts all refused), the request for it was dropped and the leader waited for ever."""

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(PODS, chaos_pod("a", "p0", ONE), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        task = asyncio.create_task(ctl.pods.run())
        try:
            await until(ctl.pods.synced.is_set, 10, "the first list")
            fake_api.control("fault", code=500, count=5, verb="GET", path_contains="/api/v1/pods")
            await port.create(PODS, chaos_pod("a", "p1", ONE), "a")
            await asyncio.wait_for(ctl.pods.resync(), 10)
            assert set(ctl.pods.cache) == {"a/p0", "a/p1"}
            assert fake_api.control("state")["injected"] == {"before 500": 5}
        finally:
            await stop(port, task)

    asyncio.run(asyncio.wait_for(go(), 30))
