"""Two replicas over the wire: exactly one binds; kill it and the standby takes over within the lease."""

from __future__ import annotations

import asyncio

from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.leader import LeaderElector, microtime
from fairgpu.k8s.port import LEASES, NODES, PODS, QUEUES
from fake_kubelet import FakeNodes
from test_live_scheduling import node, pod

LEASE, RETRY = 2.0, 0.2


def test_microtime_has_six_digits_even_on_the_second():
    from datetime import UTC, datetime

    assert microtime(datetime(2026, 1, 1, tzinfo=UTC)) == "2026-01-01T00:00:00.000000Z"


def test_two_replicas_one_binds_and_the_standby_takes_over(fake_api, tmp_path):
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> None:
        port = await KubeClient.connect(kubeconfig)
        for i in range(2):
            await port.create(NODES, node(i))
        await port.create(QUEUES, {"metadata": {"name": "team-a"}, "spec": {"namespaces": ["a"]}})
        for i in range(6):
            await port.create(PODS, pod("a", f"p{i}", {"nvidia.com/gpu": "1"}), "a")
        nodes = FakeNodes(port)
        kubelet = asyncio.create_task(nodes.run())
        profile = load_profile("fairgpu")
        replicas = []
        for ident in ("r1", "r2"):
            rport = await KubeClient.connect(kubeconfig)
            elector = LeaderElector(rport, "fairgpu-system", "fairgpu", ident, LEASE, RETRY)
            ctl = Controller(rport, profile, leadership=elector)
            tasks = [asyncio.create_task(elector.run()), asyncio.create_task(ctl.run())]
            replicas.append((elector, ctl, tasks, rport))

        async def bound() -> int:
            items, _ = await port.list(PODS)
            return sum(1 for p in items if p["spec"].get("nodeName"))

        loop = asyncio.get_running_loop()
        end = loop.time() + 20
        while await bound() < 6:
            assert loop.time() < end, "the first six pods were not bound"
            await asyncio.sleep(0.05)
        leaders = [r for r in replicas if r[0].leading.is_set()]
        assert len(leaders) == 1
        leader, standby = leaders[0], next(r for r in replicas if r is not leaders[0])
        assert leader[1].stats.binds == 6 and standby[1].stats.binds == 0
        assert standby[1].pods.synced.is_set() and len(standby[1].pods.cache) == 6  # warm cache
        lease = await port.get(LEASES, "fairgpu", "fairgpu-system")
        assert lease["spec"]["holderIdentity"] == leader[0].identity

        for t in leader[2]:  # the leader dies without releasing its lease
            t.cancel()
        await asyncio.gather(*leader[2], return_exceptions=True)
        killed = loop.time()
        for i in range(6, 9):
            await port.create(PODS, pod("a", f"p{i}", {"nvidia.com/gpu": "1"}), "a")
        while not standby[0].leading.is_set():
            assert loop.time() - killed < LEASE + 2 * RETRY + 1.0, "the standby did not take over in time"
            await asyncio.sleep(0.02)
        took_over = loop.time() - killed
        assert took_over <= LEASE + RETRY + 1.0, took_over  # expiry is judged on the standby's own clock
        while await bound() < 9:
            assert loop.time() - killed < 20, "the new leader did not bind the new pods"
            await asyncio.sleep(0.05)
        assert standby[1].stats.binds == 3
        lease = await port.get(LEASES, "fairgpu", "fairgpu-system")
        assert lease["spec"]["holderIdentity"] == standby[0].identity and lease["spec"]["leaseTransitions"] == 1
        state = fake_api.control("state")
        assert len([b for b in state["bindings"] if b["code"] == 201]) == 9  # nobody bound anything twice

        for t in [*standby[2], kubelet]:
            t.cancel()
        await asyncio.gather(*standby[2], kubelet, return_exceptions=True)
        assert not nodes.violations, nodes.violations[:3]  # HAMi's device plugin took every bound pod
        for r in replicas:
            await r[3].close()
        await port.close()

    asyncio.run(asyncio.wait_for(go(), 60))
