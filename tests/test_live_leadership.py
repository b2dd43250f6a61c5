"""Issue 11, controller side: one leader binds at a time (audited from the fake's request log), its timings
follow client-go's rules, and a term that starts again starts from a fresh list, not from what it lost."""

from __future__ import annotations

import asyncio

import pytest

from audit import audit
from chaos import chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.port import PODS
from live_setup import ONE, TINY, setup
from test_live_scheduling import until


def test_two_replicas_never_bind_in_the_same_lease_window(fake_api, tmp_path):
    """Finding 3: the leader's lease requests stall (5 s each, a slow path to the API server) while its
    other requests flow. Before: it went on binding for seconds after the standby had taken over. Now
    its renewal gives up at its deadline, it steps down and cancels its binds before the lease can expire
    on the standby's clock. Audited from the fake's request log: every Binding was written by the
    lease's holder of that moment."""
    fake_api.control("device-plugin")
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> dict[str, int]:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=40, gpus=4)
        replicas = []
        for ident in ("r1", "r2"):
            rport = await KubeClient.connect(kubeconfig)
            rport.api.user_agent = f"fairgpu/{ident}"
            elector = LeaderElector(rport, "fairgpu-system", "fairgpu", ident, 3.0, 0.25, 2.0)
            ctl = Controller(rport, load_profile("fairgpu"), leadership=elector)
            replicas.append((elector, ctl, [asyncio.create_task(elector.run()), asyncio.create_task(ctl.run())]))
        await until(lambda: any(e.leading.is_set() for e, _, _ in replicas), 10, "a leader")
        leader = next(e for e, _, _ in replicas if e.leading.is_set())
        created = 0

        async def arrive(n: int) -> None:  # a steady stream of pods that finish at once: binds never stop
            nonlocal created
            for _ in range(n):
                await port.create(PODS, chaos_pod("a", f"p{created}", TINY), "a")
                created += 1
                await asyncio.sleep(0.02)

        await arrive(50)
        fake_api.control("delay", seconds=5.0, path_contains="/leases/", agent_contains=f"fairgpu/{leader.identity}")
        await arrive(400)  # ~10 s
        for _, _, tasks in replicas:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await port.close()
        return {e.identity: c.stats.binds for e, c, _ in replicas}

    binds = asyncio.run(asyncio.wait_for(go(), 60))
    requests = fake_api.control("requests")["requests"]
    report = audit(fake_api.api.store, requests, {}, set())
    assert not report.non_leader_binds, report.non_leader_binds[:5]
    assert all(n > 0 for n in binds.values()), binds  # the standby did take over and bind


def test_leader_election_timings_follow_client_go():
    with pytest.raises(ValueError, match="leaseDuration"):
        LeaderElector(None, "ns", "l", "me", lease_duration=3.0, retry_period=0.5, renew_deadline=3.0)
    with pytest.raises(ValueError, match="retryPeriod"):
        LeaderElector(None, "ns", "l", "me", lease_duration=3.0, retry_period=2.0, renew_deadline=2.0)


def test_a_leader_that_regains_its_lease_rebuilds_what_its_lost_binds_held(fake_api, tmp_path):
    """The long soak's other stall: a leader loses its lease while a Binding is in flight (cancelled), then
    wins it back with no node or queue news in between. Before, it kept the last term's engine, in which
    the cancelled bind's workload still ran: its GPU stayed booked, the pod was never bound (flapping leaders
    piled these up until "no fit" on every node with a quarter of the GPUs in use). Now each term rebuilds
    from a fresh list, and the pod is bound."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> dict:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=1, gpus=1, tenants=("a",))
        elector = LeaderElector(port, "fairgpu-system", "fairgpu", "r1", 3.0, 0.25, 2.0)
        ctl = Controller(port, load_profile("fairgpu"), leadership=elector)
        tasks = [asyncio.create_task(elector.run()), asyncio.create_task(ctl.run())]
        try:
            await until(elector.leading.is_set, 10, "the lease")
            fake_api.control("delay", seconds=30.0, path_contains="/binding")
            await port.create(PODS, chaos_pod("a", "p", ONE), "a")
            await until(lambda: "a/p" in ctl.inflight, 10, "p's bind under way")
            await asyncio.sleep(0.5)  # its node lock taken and seen: no node news is left for the next term
            fake_api.control("delay", seconds=5.0, path_contains="/leases/")
            await until(lambda: not elector.leading.is_set(), 10, "the step-down")
            fake_api.control("clear-faults")
            await until(elector.leading.is_set, 10, "the lease again")
            await until(lambda: (ctl.pods.cache.get("a/p") or {}).get("spec", {}).get("nodeName"), 10, "p bound")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await port.close()
        return ctl.pods.cache["a/p"]

    assert asyncio.run(asyncio.wait_for(go(), 60))["spec"]["nodeName"] == "node-000"
