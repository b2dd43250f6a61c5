"""Issue 11, controller side, over HTTP against the fake apiserver: a GPU is never booked twice and no pod
is stranded when a Binding fails, loses its answer, or is left half-done (its node lock) by a leader that died."""

from __future__ import annotations

import asyncio

import pytest

from audit import audit
from chaos import chaos_node, chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.k8s import hami
from fairgpu.k8s.binder import BINDING_SETTLE
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from live_setup import GANG, ONE, pods_now, setup
from test_live_scheduling import stop, until


def test_failed_gang_bind_books_nothing_twice_and_the_gang_runs_whole(fake_api, tmp_path):
    """Finding 1: gang-0's Binding is refused (429, which says it was not carried out: a 5xx may still land, and
    the Binding would be sent again, binder.Binder._binding) while gang-1's is still in flight; another
    tenant's pod arrives meanwhile. Before: both GPUs were freed, gang-1 landed, b0 was bound to a GPU of the
    gang and gang-0 was resubmitted alone. Now the gang's room is held until every bind of it has resolved,
    gang-0 is bound again in it, and b0 waits."""
    fake_api.control("device-plugin")
    fake_api.control("fault", code=429, count=1, verb="POST", path_contains="/pods/gang-0/binding")
    fake_api.control("delay", seconds=1.5, verb="POST", path_contains="/pods/gang-1/binding")

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        for i in range(2):
            await port.create(PODS, chaos_pod("a", f"gang-{i}", ONE, GANG), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            tried = lambda: any("gang-0/binding" in r["path"] for r in fake_api.control("requests")["requests"])  # noqa: E731
            await until(tried, 10, "gang-0's first bind")
            await port.create(PODS, chaos_pod("b", "b0", ONE), "b")
            await asyncio.sleep(4.0)  # gang-1 lands, gang-0's failures are over, b0 had every chance
            await until(lambda: not ctl.inflight, 10, "binds to settle")
        finally:
            await stop(port, run)

    asyncio.run(asyncio.wait_for(go(), 60))
    report = audit(fake_api.api.store, fake_api.control("requests")["requests"], {}, set())
    assert not report.overcommit, report.overcommit
    assert not report.partial_gangs, report.partial_gangs
    pods = pods_now(fake_api)
    assert pods["a/gang-0"]["spec"].get("nodeName") and pods["a/gang-1"]["spec"].get("nodeName")
    assert not pods["b/b0"]["spec"].get("nodeName")


@pytest.mark.parametrize("settle", [BINDING_SETTLE, 0.0], ids=["sent again", "read back"])
def test_a_bind_whose_answer_was_lost_counts_as_landed(fake_api, tmp_path, settle):
    """The client's first four attempts are refused (503), the fifth is committed but its answer lost
    (connection dropped). Such a failure may have landed: the Binding is sent again and answered 409 "already
    assigned" to that node (binder.Binder._binding), so nothing failed. Without sending it again (`settle` 0,
    as after the settle window), the controller reads the pod back, finds it bound where it put it, and rolls
    nothing back either."""
    fake_api.control("device-plugin")
    fake_api.control("fault", code=0, count=1, verb="POST", path_contains="/pods/p0/binding", after=True)
    fake_api.control("fault", code=503, count=4, verb="POST", path_contains="/pods/p0/binding")

    async def go() -> Controller:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        await port.create(PODS, chaos_pod("a", "p0", ONE), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        ctl.binder.settle = settle
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "the bind")
            await port.create(PODS, chaos_pod("b", "b0", ONE), "b")
            await until(lambda: ctl.stats.binds == 2 and not ctl.inflight, 10, "b0's bind")
        finally:
            await stop(port, run)
        return ctl

    ctl = asyncio.run(asyncio.wait_for(go(), 60))
    assert ctl.stats.rollbacks == 0 and ctl.stats.bind_failures == (0 if settle else 1)
    report = audit(fake_api.api.store, fake_api.control("requests")["requests"], {}, set())
    assert not report.overcommit, report.overcommit
    state = fake_api.control("state")
    assert state["injected"] == {"after 0": 1, "before 503": 4}


def test_node_locks_left_by_a_leader_that_died_mid_bind_do_not_hold_nodes(fake_api, tmp_path):
    """The long soak's stall: a leader that loses its lease (or dies) mid-bind has taken HAMi's node lock and
    never releases it. Before, the lock held its node for HAMi's whole expiry (5 min) while its owner pod
    existed: leaders flapping under load left 35 of 40 nodes locked and binding stopped. Now a lock is stale
    when its owner is bound to another node (node-0: x was bound to node-1 by the next leader), or is one of
    ours that this leader is not binding to that node: z cannot be placed now (node-4); c and d are being
    bound each to the node the other one locked (node-2, node-3: with only "not in flight" as the test, each
    waited for the other). Every pod placeable is bound within seconds."""
    fake_api.control("device-plugin")
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    def on(slot: str, name: str) -> dict:
        p = chaos_pod("a", name, ONE)
        p["spec"]["nodeSelector"] = {"slot": slot}
        return p

    async def go() -> dict[str, dict]:
        port = await KubeClient.connect(kubeconfig)
        for i in range(5):
            n = chaos_node(i, 1)
            n["metadata"]["labels"] = {"slot": str(i)}
            await port.create(NODES, n)
        await port.create(QUEUES, {"metadata": {"name": "q-a"}, "spec": {"namespaces": ["a"]}})
        x = on("1", "x")
        x["spec"]["nodeName"] = "node-001"
        alloc = hami.encode_devices([[hami.DeviceUse("GPU-001-0", hami.VENDOR, 40960, 100)]])
        x["metadata"]["annotations"] = {hami.ALLOCATED: alloc, hami.TO_ALLOCATE: alloc}
        for p in (x, on("nowhere", "z"), on("3", "c"), on("2", "d")):
            await port.create(PODS, p, "a")
        taken = Controller(port, load_profile("fairgpu")).binder.clock()
        for node, owner in (("node-000", "x"), ("node-002", "c"), ("node-003", "d"), ("node-004", "z")):
            lock = hami.NodeLock(taken, "a", owner).encode()
            await port.patch(NODES, node, {"metadata": {"annotations": {hami.NODE_LOCK: lock}}})
        ctl = Controller(port, load_profile("fairgpu"))
        task = asyncio.create_task(ctl.run())
        try:
            for slot, name in (("0", "y"), ("4", "w")):
                await port.create(PODS, on(slot, name), "a")
            where = lambda: {n: (ctl.pods.cache.get(f"a/{n}") or {}).get("spec", {}).get("nodeName") for n in "ywcd"}  # noqa: E731
            await until(lambda: all(where().values()), 15, "y, w, c and d bound past the stale locks")
        finally:
            await stop(port, task)
        return pods_now(fake_api)

    pods = asyncio.run(asyncio.wait_for(go(), 40))
    nodes = {k: pods[f"a/{k}"]["spec"].get("nodeName") for k in "ywcdz"}
    assert nodes == {"y": "node-000", "w": "node-004", "c": "node-003", "d": "node-002", "z": None}
