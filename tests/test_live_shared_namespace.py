"""Two queues that both list a namespace: its unlabelled pods are charged to the OLDER queue, whatever order a
cache lists the queues in, so a restart or a new leader never moves a tenant's pods to another team's share.
Before, the first queue in the informer cache's order won: the queue that arrived first by watch for one
controller, the first by name for its successor (a fresh list). The younger claimant is told, on its status
and by a Warning Event, until the overlap is gone. Names and ages disagree on purpose: team-b is older."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.kubectl import queue_rows
from fairgpu.k8s.port import EVENTS, NODES, PODS, QUEUES
from fairgpu.k8s.queues import EXCLUSIVE, SHADOWED, QueueEntry, queue_map
from fairgpu.model import QueueSpec
from fake_kubelet import FakeNodes
from test_live_scheduling import node, pod, stop, until


def entry(name: str, namespaces: tuple[str, ...], created: str) -> QueueEntry:
    return QueueEntry(QueueSpec(name), namespaces, created)


def test_the_oldest_claimant_serves_a_namespace_in_any_listing_order():
    older = entry("zeta", ("a", "b"), "2026-01-01T00:00:00Z")
    younger = entry("alpha", ("a", "c"), "2026-01-02T00:00:00Z")
    twin = entry("beta", ("b",), "2026-01-01T00:00:00Z")  # as old as zeta: the name decides
    unstamped = entry("aaa", ("c",), "")  # no creation time: counts as the youngest
    for order in ([older, younger, twin, unstamped], [unstamped, twin, younger, older]):
        m = queue_map(order)
        assert m.serving == {"a": "zeta", "b": "beta", "c": "alpha"}
        assert m.allowed["alpha"] == ("a", "c")  # labelled pods keep using the younger queue there
        assert set(m.shadowed) == {"alpha", "zeta", "aaa"}
        assert "a (served by 'zeta')" in m.shadowed["alpha"] and "c (" not in m.shadowed["alpha"]
        assert "b (served by 'beta')" in m.shadowed["zeta"]


def test_kubectl_queues_shows_why_a_queue_does_not_serve_a_namespace():
    status = {"conditions": [{"type": "Valid", "status": "True", "message": ""},
                             {"type": EXCLUSIVE, "status": "False", "message": "shared: namespace a"}]}  # fmt: skip
    rows = queue_rows([{"metadata": {"name": "team-a"}, "spec": {}, "status": status}])
    assert rows[0]["message"] == "shared: namespace a" and rows[0]["valid"] == "True"


async def usage(port, name: str) -> str | None:
    return ((await port.get(QUEUES, name)).get("status") or {}).get("usage", {}).get("nvidia.com/gpu")


async def conditions(port, name: str) -> dict[str, dict]:
    return {c["type"]: c for c in ((await port.get(QUEUES, name)).get("status") or {}).get("conditions", [])}


async def settle(port, ctl: Controller, want: dict[str, str], what: str) -> None:
    """Until the queues' published GPU usage is `want`; fails naming what they show instead. The status is
    written after a cycle: the controller is woken so that an idle one cycles again."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 15
    while True:
        got = {q: await usage(port, q) for q in want}
        if got == want:
            return
        ctl.wake.set()
        assert loop.time() < end, f"{what}: queue usage {got}, expected {want}"
        await asyncio.sleep(0.1)


async def two_claimants(fake_api, port) -> None:
    """team-b claims namespace a; a minute later team-a claims it too (and b)."""
    await port.create(QUEUES, {"metadata": {"name": "team-b"}, "spec": {"namespaces": ["a"]}})
    fake_api.call(lambda: setattr(fake_api.api.store, "clock_offset", timedelta(seconds=60)))
    await port.create(QUEUES, {"metadata": {"name": "team-a"}, "spec": {"namespaces": ["a", "b"]}})


async def started(port) -> tuple[Controller, asyncio.Task]:
    ctl = Controller(port, load_profile("fairgpu"))
    ctl.status_every = 0.2
    return ctl, asyncio.create_task(ctl.run())


async def stopped(ctl: Controller, task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await ctl.carry.close()


async def shut(ctl: Controller, task: asyncio.Task, feed: asyncio.Task, port) -> None:
    await stopped(ctl, task)
    await stop(port, feed)


def test_unlabelled_pods_stay_with_the_older_queue_across_a_restart(fake_api, tmp_path):
    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        kubelet = FakeNodes(port)
        feed = asyncio.create_task(kubelet.run())
        ctl, task = await started(port)
        try:
            await until(ctl.synced, 10, "the caches")
            await two_claimants(fake_api, port)  # this controller sees them arrive: team-b first
            await until(lambda: len(ctl.queues.cache) == 2, 10, "both queues in the cache")
            await port.create(PODS, pod("a", "p1", {"nvidia.com/gpu": "2"}), "a")
            labelled = pod("a", "l1", {"nvidia.com/gpu": "1"}, {"fairgpu.io/queue": "team-a"})
            await port.create(PODS, labelled, "a")  # the younger claimant stays usable by label
            await settle(port, ctl, {"team-b": "2.00", "team-a": "1.00"}, "first controller")
            await stopped(ctl, task)

            # A successor lists the queues afresh: the cache now has them in name order, team-a first.
            ctl, task = await started(port)
            await until(ctl.synced, 10, "the successor's caches")
            assert list(ctl.queues.cache) == ["/team-a", "/team-b"]
            await port.create(PODS, pod("a", "p2", {"nvidia.com/gpu": "1"}), "a")
            await until(lambda: ctl.pods.cache.get("a/p2", {}).get("spec", {}).get("nodeName"), 10, "p2 to be bound")
            await settle(port, ctl, {"team-b": "3.00", "team-a": "1.00"}, "after the restart")
            assert not kubelet.violations, kubelet.violations
        finally:
            await shut(ctl, task, feed, port)

    asyncio.run(asyncio.wait_for(go(), 90))


def test_the_younger_claimant_is_told_until_the_overlap_is_gone(fake_api, tmp_path):
    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        await two_claimants(fake_api, port)
        kubelet = FakeNodes(port)
        feed = asyncio.create_task(kubelet.run())
        ctl, task = await started(port)
        try:

            async def shadowed() -> dict | None:
                return (await conditions(port, "team-a")).get(EXCLUSIVE)

            loop = asyncio.get_running_loop()
            end = loop.time() + 15
            while (cond := await shadowed()) is None:
                assert loop.time() < end, "no NamespacesExclusive condition on team-a"
                await asyncio.sleep(0.1)
            assert cond["status"] == "False" and cond["reason"] == SHADOWED
            assert "a (served by 'team-b')" in cond["message"] and "b (" not in cond["message"]
            assert EXCLUSIVE not in await conditions(port, "team-b")
            events, _ = await port.list(EVENTS, "default")
            warned = [e for e in events if e["reason"] == SHADOWED]
            assert [(e["involvedObject"]["kind"], e["involvedObject"]["name"], e["type"]) for e in warned] == [
                ("Queue", "team-a", "Warning")
            ]
            assert "namespace" not in warned[0]["involvedObject"]  # queues are cluster-scoped

            # Later status writes (team-a's usage changes) keep the condition.
            await port.create(PODS, pod("a", "l1", {"nvidia.com/gpu": "1"}, {"fairgpu.io/queue": "team-a"}), "a")
            await settle(port, ctl, {"team-a": "1.00"}, "team-a's pod")
            assert (await shadowed()) == cond
            assert (await conditions(port, "team-a"))["Valid"]["status"] == "True"

            # The admin drops namespace a from team-a: the condition goes.
            await port.patch(QUEUES, "team-a", {"spec": {"namespaces": ["b"]}})
            end = loop.time() + 15
            while await shadowed() is not None:
                assert loop.time() < end, "the NamespacesExclusive condition stayed on team-a"
                await asyncio.sleep(0.1)
            assert (await conditions(port, "team-a"))["Valid"]["status"] == "True"
        finally:
            await shut(ctl, task, feed, port)

    asyncio.run(asyncio.wait_for(go(), 90))
