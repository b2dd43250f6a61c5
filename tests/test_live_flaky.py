"""Session 13 (safe9): what a flaky network (a watch that stalls, then replays a burst) or a quick owner can make
land between two controller passes never strands a pod nor leaves a GPU booked for a pod that is not there."""

from __future__ import annotations

import asyncio
import json

import pytest

from audit import audit
from chaos import chaos_node, chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.errors import KubeError
from fairgpu.k8s import hami
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from fairgpu.k8s.writes import Writes
from fake_kubelet import FakeNodes
from live_setup import ONE, pods_now, setup
from test_live_scheduling import stop, until


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


def test_a_binding_the_api_server_timed_out_and_carries_out_later_books_nothing_twice(fake_api, tmp_path):
    """The API server answers p0's Binding 504 (its timeout) while the write goes on, and commits it 1 s later;
    the client's four retries are refused with 503 meanwhile. Before: the controller read p0 back, found it
    unbound and freed its GPU; b/b0 came first (queue a runs a1 already) and was bound to the same card; then
    p0's Binding landed on it too. Now a Binding
    whose failure may still land is sent again until an answer settles it (here 201; 409 "already assigned"
    had the first landed): p0 runs, b0 waits."""
    fake_api.control("device-plugin")
    fake_api.control("fault", code=504, count=1, verb="POST", path_contains="/pods/p0/binding", late=1.0)
    fake_api.control("fault", code=503, count=4, verb="POST", path_contains="/pods/p0/binding")

    async def go() -> Controller:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        await port.create(PODS, chaos_pod("a", "a1", ONE), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "a1's bind")
            await port.create(PODS, chaos_pod("a", "p0", ONE), "a")
            await until(lambda: "a/p0" in ctl.inflight, 10, "p0's bind")
            await port.create(PODS, chaos_pod("b", "b0", ONE), "b")
            await until(lambda: fake_api.control("state")["injected"].get("before 503") == 4, 10, "the retries")
            await asyncio.sleep(0.6)  # past the late commit
            await until(lambda: not ctl.inflight, 10, "binds to settle")
        finally:
            await stop(port, run)
        return ctl

    ctl = asyncio.run(asyncio.wait_for(go(), 30))
    report = audit(fake_api.api.store, fake_api.control("requests")["requests"], {}, set())
    assert not report.overcommit, report.overcommit
    pods = pods_now(fake_api)
    assert pods["a/p0"]["spec"].get("nodeName") == "node-000"
    assert not pods["b/b0"]["spec"].get("nodeName")
    assert ctl.stats.rollbacks == 0


@pytest.mark.parametrize("code", [0, 500, 504])
def test_a_write_answered_with_a_5xx_may_still_land_and_keeps_the_lease_from_release(code):
    """A graceful stop or a hung leader's elector releases the lease only when no write of a decision may still
    land (writes.Writes.quiet). Before, only a write with no answer at all counted: one answered 504 (the API
    server's timeout, its handler going on) or 500 (an etcd request that timed out but commits) let the lease
    go at once, and the Binding could land after a standby took over. A refusal (429, 409) is final."""

    async def refused(c: int) -> None:
        raise KubeError(c, "", "")

    async def go() -> tuple[bool, bool]:
        writes, outcomes = Writes(), []
        for c in (code, 429):
            fresh = Writes() if c == 429 else writes
            with pytest.raises(KubeError):
                await fresh.send(lambda: None, refused, c)
            outcomes.append(fresh.quiet(15.0))
        return outcomes[0], outcomes[1]

    uncertain, refusal = asyncio.run(go())
    assert not uncertain
    assert refusal


def test_a_card_that_leaves_the_inventory_and_comes_back_stays_booked_for_the_pod_on_it(fake_api, tmp_path):
    """a/p0 runs on one of node-000's two cards. That card drops out of HAMi's register (fallen off the bus, a
    device plugin rescan), then the whole node's allocatable GPUs go to 0 (the device plugin restarting), then
    both come back. Each change rebuilds the engine from the cache: b/b0 may take the other card, c/c0 never
    p0's. (Holds: no defect found; this proves it.)"""
    fake_api.control("device-plugin")

    async def go() -> tuple[Controller, str]:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2, tenants=("a", "b", "c"))
        await port.create(PODS, chaos_pod("a", "p0", ONE), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "p0's bind")
            held = hami.decode_devices(ctl.pods.cache["a/p0"]["metadata"]["annotations"][hami.ALLOCATED])[0][0].uuid
            whole = chaos_node(0, 2)
            devices = json.loads(whole["metadata"]["annotations"][hami.NODE_REGISTER])
            fewer = json.dumps([d for d in devices if d["id"] != held])
            rebuilds = ctl.stats.rebuilds
            await port.patch(NODES, "node-000", {"metadata": {"annotations": {hami.NODE_REGISTER: fewer}}})
            await until(lambda: ctl.stats.rebuilds == rebuilds + 1, 10, "the rebuild without p0's card")
            await port.create(PODS, chaos_pod("b", "b0", ONE), "b")
            await until(lambda: ctl.stats.binds == 2 and not ctl.inflight, 10, "b0 on the other card")
            await port.patch(
                NODES, "node-000", {"status": {"allocatable": {"nvidia.com/gpu": "0"}}}, subresource="status"
            )
            await until(lambda: ctl.stats.rebuilds == rebuilds + 2, 10, "the rebuild without GPUs")
            await port.patch(NODES, "node-000", {"status": whole["status"]}, subresource="status")
            await port.patch(NODES, "node-000", {"metadata": whole["metadata"]})
            both = lambda: ctl.stats.rebuilds >= rebuilds + 3 and len(ctl.engine.state.nodes[0].gpus) == 2  # noqa: E731
            await until(both, 10, "the rebuild with both cards")
            await port.create(PODS, chaos_pod("c", "c0", ONE), "c")
            await until(lambda: "c/c0" in ctl.pods.cache and ctl.stats.cycles > 3, 10, "c0 seen")
            await asyncio.sleep(0.3)  # a few passes: c0 had every chance
        finally:
            await stop(port, run)
        return ctl, held

    ctl, held = asyncio.run(asyncio.wait_for(go(), 30))
    pods = pods_now(fake_api)
    assert not pods["c/c0"]["spec"].get("nodeName")
    slot = [g.uuid for g in ctl.engine.state.nodes[0].gpus].index(held)
    assert ctl.engine.state.placement("a/p0").slots == (slot,)
    report = audit(fake_api.api.store, fake_api.control("requests")["requests"], {}, set())
    assert not report.overcommit, report.overcommit


def test_an_eviction_sent_after_a_pass_still_names_the_victim_the_engine_chose():
    """A gang's members are evicted one after another. While v-0's Eviction is on the wire, v-1 is deleted and
    made again under its name, and a pass parses the new pod (and drops the workload). Before: v-1's Eviction
    carried the UID parsed last, the new pod's, which the engine never chose: a new pod of the victim's name was
    evicted. Now it carries the UID held when the engine decided: the API server refuses it (409, the UID
    precondition), which counts as gone."""
    from types import SimpleNamespace

    from fairgpu.framework.interfaces import Evict
    from fairgpu.k8s.carryout import CarryOut, Stats
    from fairgpu.k8s.parsed import ParsedPods
    from fairgpu.k8s.translate import pod_info

    def parsed(name: str, uid: str):
        obj = chaos_pod("b", name, ONE)
        obj["metadata"]["uid"] = uid
        return pod_info(obj)

    class Port:
        def __init__(self) -> None:
            self.sent: list[tuple[str, str | None]] = []
            self.first = asyncio.Event()

        async def evict(self, ns: str, name: str, grace: int | None = None, uid: str | None = None) -> None:
            self.sent.append((name, uid))
            if name == "v-0":
                await self.first.wait()

    async def go() -> list[tuple[str, str | None]]:
        port = Port()
        reporter = SimpleNamespace(preempted=lambda key, why: None)
        pods = ParsedPods()
        carry = CarryOut(port, reporter, pods, lambda key: None, lambda: 1e9, lambda: None, Stats(), {}, Writes())
        keys = ("b/v-0", "b/v-1")
        pods.infos = {k: parsed(k[2:], f"old-{k[2:]}") for k in keys}
        carry.book = SimpleNamespace(members={"W": keys}, uids={k: f"old-{k[2:]}" for k in keys})
        task = asyncio.create_task(carry._evict(Evict("W", "reclaim"), 1))
        await asyncio.sleep(0.01)  # v-0's Eviction is on the wire
        pods.infos["b/v-1"] = parsed("v-1", "new-v-1")  # a pass parsed the new pod
        carry.book.members, carry.book.uids = {}, {}  # ... and dropped the workload
        port.first.set()
        await task
        return port.sent

    assert asyncio.run(go()) == [("v-0", "old-v-0"), ("v-1", "old-v-1")]


def test_a_pending_reason_that_lands_after_the_bind_never_overwrites_the_running_pods_conditions(fake_api, tmp_path):
    """b/p waits (a/blocker holds the only GPU) and its PodScheduled=False reason is on the wire, slow (the API
    server takes a second); meanwhile the blocker goes, p is bound and the kubelet marks it Ready. Before: the
    late write replaced the running pod's conditions (a merge patch replaces the list) with PodScheduled=False:
    its Ready condition was gone until the kubelet's next sync (a Service drops such a pod). Now the reason is
    written on condition that the pod is the version it was decided for (its resourceVersion, the other
    conditions kept): the write made stale by the bind is refused (409) and dropped."""

    async def go() -> dict:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=1)
        await port.create(PODS, chaos_pod("a", "blocker", ONE), "a")
        ours = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        ours.api.user_agent = "fairgpu/r1"
        ctl = Controller(ours, load_profile("fairgpu"))
        kubelet = FakeNodes(port)
        tasks = [asyncio.create_task(ctl.run()), asyncio.create_task(kubelet.run())]
        try:
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "the blocker's bind")
            fake_api.control(
                "delay", seconds=1.0, verb="PATCH", path_contains="/pods/p/status", agent_contains="fairgpu/"
            )
            await port.create(PODS, chaos_pod("b", "p", ONE), "b")
            await until(lambda: ctl.reporter.last.get("b/p"), 10, "p's reason")
            await asyncio.sleep(0.1)  # on the wire
            await port.delete(PODS, "blocker", "a", grace_seconds=0)

            def ready() -> bool:
                status = (kubelet.informer.cache.get("b/p") or {}).get("status") or {}
                return any(c.get("type") == "Ready" for c in status.get("conditions") or [])

            await until(ready, 10, "p to run")
            await asyncio.sleep(1.2)  # the slow reason lands (or is refused)
            return await port.get(PODS, "p", "b")
        finally:
            await stop(ours, *tasks)
            await port.close()

    p = asyncio.run(asyncio.wait_for(go(), 30))
    conditions = {c["type"]: c["status"] for c in p["status"].get("conditions") or []}
    assert p["spec"]["nodeName"] == "node-000"
    assert conditions.get("Ready") == "True", conditions
    assert conditions.get("PodScheduled") != "False", conditions
