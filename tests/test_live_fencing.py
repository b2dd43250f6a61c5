"""The leader fence on every write that carries out a decision, over HTTP against the fake (k8s/writes.py):
Evictions, HAMi's pod annotations, node locks and gang marks pass it as Bindings do, and count as on the wire
for the graceful stop and the hung leader's hand-over."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine

import pytest

from chaos import chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.k8s import carryout
from fairgpu.k8s import replica as replica_module
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.heartbeat import Heartbeat
from fairgpu.k8s.leader import LeaderElector, term_ended
from fairgpu.k8s.port import LEASES, NODES, PODS, QUEUES
from fairgpu.k8s.replica import run_replica
from fairgpu.k8s.workloads import GANG_ADMITTED
from fake_kubelet import FakeNodes
from live_setup import GANG, ONE, pods_now, setup
from test_live_preemption import ONE_GPU, queues
from test_live_scheduling import node, pod, stop, until

NS = "fairgpu-system"


class Lease:
    """What a controller reads of its elector (leader.Leadership), moved by the test. `close()` is the elector's
    step-down as its own thread or process makes it: the deadline `remaining()` reads is gone at once, while
    the scheduling loop has not heard of it yet; `end()` is that news reaching the loop."""

    def __init__(self) -> None:
        self.leading = asyncio.Event()
        self.term = 0
        self.on_lost: list = []
        self.until = 0.0

    def remaining(self) -> float:
        return max(0.0, self.until - time.monotonic())

    def begin(self) -> None:
        self.until, self.term = math.inf, self.term + 1
        self.leading.set()

    def close(self) -> None:
        self.until = 0.0

    def end(self) -> None:
        self.close()
        term_ended(self)


async def connect(kubeconfig: str, ident: str) -> KubeClient:
    port = await KubeClient.connect(kubeconfig)
    port.api.user_agent = f"fairgpu/{ident}"
    return port


async def one_node(kubeconfig: str, b_pods: int = 0) -> KubeClient:
    """The test's own client, after creating one node (test_live_scheduling.node), the queues and `b_pods`
    one-GPU pods of queue b."""
    port = await KubeClient.connect(kubeconfig)
    await port.create(NODES, node(0))
    for q in queues():
        await port.create(QUEUES, q)
    for i in range(b_pods):
        await port.create(PODS, pod("b", f"b-{i}", ONE_GPU), "b")
    return port


@contextlib.asynccontextmanager
async def fenced_when(
    kubeconfig: str, monkeypatch, decided: Callable, close: Callable, *also: Coroutine
) -> AsyncIterator[tuple[Controller, Controller, Lease, Lease, list[float]]]:
    """r1 leads and r2 waits; as r1 starts carrying out the first cycle result `decided` picks, `close(lease1,
    r1)` shuts r1's fence (its loop not told yet) and the moment is recorded. Yields (r1, r2, their leases,
    [that moment]); `also` (a fake kubelet) runs beside them."""
    lease1, lease2 = Lease(), Lease()
    r1 = Controller(await connect(kubeconfig, "r1"), load_profile("fairgpu"), leadership=lease1)
    r2 = Controller(await connect(kubeconfig, "r2"), load_profile("fairgpu"), leadership=lease2)
    fenced: list[float] = []
    start = r1.carry.start

    def fence_then_start(result) -> None:
        if decided(result) and not fenced:
            fenced.append(time.monotonic())
            close(lease1, r1)
        start(result)

    monkeypatch.setattr(r1.carry, "start", fence_then_start)
    lease1.begin()
    tasks = [asyncio.create_task(t) for t in (*also, r1.run(), r2.run())]
    try:
        yield r1, r2, lease1, lease2, fenced
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in (r1.port, r2.port):
            await p.close()


def decision_writes(requests: list[dict], agent: str, after: float = -math.inf) -> list[tuple[str, str]]:
    """(verb, path) of the writes carrying out a decision that `agent` sent after `after` (the fake's log):
    Bindings, Evictions, and PATCHes of pods (not their status) and nodes."""
    out = []
    for r in requests:
        if r["agent"] != agent or r["t"] <= after:
            continue
        path = r["path"]
        patch = r["verb"] == "PATCH" and ("/pods/" in path or "/nodes/" in path) and not path.endswith("/status")
        if path.endswith(("/binding", "/eviction")) or patch:
            out.append((r["verb"], path))
    return out


def evictions_by(requests: list[dict], agent: str) -> list[str]:
    return [r["path"].split("/")[-2] for r in requests if r["path"].endswith("/eviction") and r["agent"] == agent]


@pytest.mark.parametrize("how", ["the lease ends mid-cycle", "a graceful stop began"])
def test_a_fenced_leader_evicts_nobody_and_the_new_leader_does(fake_api, tmp_path, monkeypatch, how):
    """b's 8 pods fill the node, borrowing a's guarantee; a's two pods arrive and r1's cycle decides to evict
    two of b's. Its fence closes right then (its elector stepped down while the cycle ran, the loop not told
    yet; or a graceful stop began): no Eviction leaves r1 (before, Bindings were fenced but Evictions went
    out), nor any other write of the decision, and all of b's pods keep running. The news reaches r1's loop
    and r2 leads: it takes the same decision and evicts two of b's pods, and a's pods run, on no GPU twice."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> tuple[float, list[str], int]:
        port = await one_node(kubeconfig, b_pods=8)
        nodes = FakeNodes(port)

        def running(ns: str) -> set[str]:
            cache = nodes.informer.cache
            return {
                k
                for k, o in cache.items()
                if k.startswith(f"{ns}/")
                and (o.get("status") or {}).get("phase") == "Running"
                and not o["metadata"].get("deletionTimestamp")
            }

        def close(lease: Lease, r1: Controller) -> None:
            lease.close() if how == "the lease ends mid-cycle" else r1.stop_binding()

        try:
            async with fenced_when(kubeconfig, monkeypatch, lambda r: r.evictions, close, nodes.run()) as (
                _,
                _,
                lease1,
                lease2,
                fenced,
            ):
                await until(lambda: len(running("b")) == 8, 20, "b to fill the node")
                for i in range(2):
                    await port.create(PODS, pod("a", f"a-{i}", ONE_GPU), "a")
                await until(lambda: fenced, 10, "r1's cycle deciding the evictions")
                await asyncio.sleep(1.0)  # time enough for an Eviction (and b's grace) before r2 leads
                b_running = len(running("b"))
                lease1.end()
                lease2.begin()
                await until(lambda: len(running("a")) == 2, 20, "a's pods to run, after r2's evictions")
                assert not nodes.violations, nodes.violations  # no GPU held by a victim and its preemptor at once
        finally:
            await port.close()
        return fenced[0], sorted(running("b")), b_running

    fenced_at, b_left, b_running = asyncio.run(asyncio.wait_for(go(), 60))
    requests = fake_api.control("requests")["requests"]
    assert decision_writes(requests, "fairgpu/r1", fenced_at) == []  # nothing of the decision left r1
    assert b_running == 8  # the victims r1 chose kept running
    evicted = evictions_by(requests, "fairgpu/r2")
    assert len(evicted) == 2 and not set(evicted) & {k.split("/")[1] for k in b_left}, (evicted, b_left)
    assert len(b_left) == 6 and evictions_by(requests, "fairgpu/r1") == []


def test_a_fenced_leader_neither_annotates_nor_locks_for_a_pod_it_placed(fake_api, tmp_path, monkeypatch):
    """A pod placed by r1's cycle while its fence closes: before, HAMi's annotations were written on the pod
    and the node was locked (only the Binding was fenced), and the lock then held the node for the new
    leader's binds. Now nothing is written, and r2, leading next, binds the pod."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> float:
        port = await one_node(kubeconfig)
        try:
            async with fenced_when(kubeconfig, monkeypatch, lambda r: r.bound, lambda lease, _: lease.close()) as (
                r1,
                r2,
                lease1,
                lease2,
                fenced,
            ):
                await port.create(PODS, pod("a", "p", ONE_GPU), "a")
                await until(lambda: fenced and not r1.carry.inflight, 10, "r1's bind to give up")
                await asyncio.sleep(0.3)
                lease1.end()
                lease2.begin()
                await until(lambda: r2.stats.binds == 1, 10, "r2's bind")
        finally:
            await port.close()
        return fenced[0]

    fenced_at = asyncio.run(asyncio.wait_for(go(), 30))
    requests = fake_api.control("requests")["requests"]
    assert decision_writes(requests, "fairgpu/r1", fenced_at) == []
    assert ("POST", "/api/v1/namespaces/a/pods/p/binding") in decision_writes(requests, "fairgpu/r2")


def test_a_stop_with_an_eviction_unanswered_leaves_the_lease_to_expire(fake_api, tmp_path, monkeypatch):
    """An Eviction is on the wire when the graceful stop's wait ends (the API server holds it 5 s): a victim
    evicted after a standby took over would die for a decision the new leader did not make, so the lease is
    not released, as for a Binding. Before, an Eviction counted for nothing and the lease was released."""
    from fairgpu.k8s.writes import Writes

    monkeypatch.setattr(replica_module, "DRAIN_S", 0.3)
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> dict:
        port = await one_node(kubeconfig, b_pods=8)
        nodes = FakeNodes(port)
        kubelet = asyncio.create_task(nodes.run())
        r1_port = await connect(kubeconfig, "r1")
        beat, writes = Heartbeat(), Writes()
        elector = LeaderElector(r1_port, NS, "fairgpu", "r1", 3.0, 0.25, 2.0, heartbeat=beat, writes=writes)
        r1 = Controller(r1_port, load_profile("fairgpu"), leadership=elector, heartbeat=beat, writes=writes)
        replica = asyncio.create_task(run_replica(r1, elector))
        try:
            await until(lambda: r1.stats.binds == 8, 20, "b to fill the node")
            fake_api.control("delay", seconds=5.0, path_contains="/eviction")
            await port.create(PODS, pod("a", "a-0", ONE_GPU), "a")
            await until(lambda: r1.stats.cycles and r1.engine.preempting.evicted_for, 10, "the eviction's decision")
            await asyncio.sleep(0.2)  # on the wire
            replica.cancel()
            await asyncio.gather(replica, return_exceptions=True)
            return await port.get(LEASES, "fairgpu", NS)
        finally:
            kubelet.cancel()
            await asyncio.gather(kubelet, return_exceptions=True)
            await r1_port.close()
            await port.close()

    assert asyncio.run(asyncio.wait_for(go(), 30))["spec"]["holderIdentity"] == "r1"


@pytest.mark.parametrize("renewed", [True, False], ids=["the term is renewed", "the term is lost"])
def test_a_gang_rollback_stopped_by_the_fence_waits_and_never_writes_past_its_term(
    fake_api, tmp_path, monkeypatch, renewed
):
    """gang-1's Binding is always refused (429), so once its retries are spent the gang is rolled back: gang-0, which
    landed, is to be evicted and both lose the admitted mark. The fence closes just as the rollback starts.
    Nothing of it is sent while closed (it retries, carryout.UNDO_RETRY); when a renewal in time keeps the
    term, the rollback completes: gang-0 is evicted and the marks are gone. When the term is lost instead,
    the old leader never sends it (the new leader decides afresh). Before the retry, a rollback stopped by the
    fence was abandoned: gang-0 ran on alone as a half gang holding a GPU, its mark still saying "admitted"."""
    monkeypatch.setattr(carryout, "UNDO_RETRY", 0.2)
    fake_api.control("device-plugin")
    fake_api.control("fault", code=429, count=100, verb="POST", path_contains="/pods/gang-1/binding")
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))
    rolled: list[float] = []

    async def go() -> tuple[list, list]:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=1, gpus=2)
        for i in range(2):
            await port.create(PODS, chaos_pod("a", f"gang-{i}", ONE, GANG), "a")
        lease = Lease()
        ctl = Controller(await connect(kubeconfig, "r1"), load_profile("fairgpu"), leadership=lease)
        undo = ctl.carry._undo_gang

        async def undo_behind_a_closed_fence(name: str, keys: tuple[str, ...], landed: list[str]) -> None:
            rolled.append(time.monotonic())
            lease.close()
            await undo(name, keys, landed)

        monkeypatch.setattr(ctl.carry, "_undo_gang", undo_behind_a_closed_fence)
        lease.begin()
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: rolled, 20, "the gang's rollback")
            await asyncio.sleep(0.5)  # retries behind the closed fence
            while_closed = decision_writes(fake_api.control("requests")["requests"], "fairgpu/r1", rolled[0])
            if renewed:
                lease.until = math.inf  # renewed in time: the same term, the fence open again
                gone = lambda: evictions_by(fake_api.control("requests")["requests"], "fairgpu/r1")  # noqa: E731
                await until(gone, 10, "the rollback's eviction")
            else:
                lease.end()
                await asyncio.sleep(0.5)
            after = decision_writes(fake_api.control("requests")["requests"], "fairgpu/r1", rolled[0])
        finally:
            await stop(ctl.port, run)
            await port.close()
        return while_closed, after

    while_closed, after = asyncio.run(asyncio.wait_for(go(), 60))
    assert while_closed == []
    pods = pods_now(fake_api)
    if renewed:
        assert ("POST", "/api/v1/namespaces/a/pods/gang-0/eviction") in after, after
        marks = [p["metadata"].get("annotations", {}).get(GANG_ADMITTED) for k, p in pods.items() if "gang-" in k]
        assert marks and not any(marks), marks
    else:
        assert after == []
        assert pods["a/gang-0"]["spec"].get("nodeName")  # left for the next leader, not evicted by this one
