"""Preemption over the wire, against the fake apiserver: a queue that lent its GPUs takes them back through
the Eviction API (policy/v1, the victim queue's grace period as deleteOptions.gracePeriodSeconds); a
PodDisruptionBudget's 429 makes the engine pick another victim; an elastic workload gives back only the pods
the engine names."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fairgpu.catalog import load_profile
from fairgpu.errors import KubeError
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES, Kind
from fake_kubelet import FakeNodes
from test_live_scheduling import node, pod, stop, until

PDBS = Kind("policy", "v1", "poddisruptionbudgets", True)
GRACE = 1  # seconds: queue b's grace period, short to keep the tests quick
ONE_GPU = {"nvidia.com/gpu": "1"}


def queues() -> list[dict]:
    """One node of 8 GPUs; a and b are guaranteed 4 each. Idle a lends its 4 to b."""
    return [
        {"metadata": {"name": "team-a"}, "spec": {"namespaces": ["a"], "guaranteed": {"nvidia.com/gpu": 4}}},
        {
            "metadata": {"name": "team-b"},
            "spec": {
                "namespaces": ["b"],
                "guaranteed": {"nvidia.com/gpu": 4},
                "preemption": {"reclaim": True, "grace_period": f"{GRACE}s"},
            },
        },
    ]


def with_priority(obj: dict, priority: int) -> dict:
    obj["spec"]["priority"] = priority
    return obj


Scenario = Callable[[KubeClient, Controller, FakeNodes, Callable[[], dict]], Awaitable[None]]


def run(fake_api, tmp_path, b_pods: list[dict], scenario: Scenario, restart: bool = False) -> None:
    """b's pods fill the node (borrowing a's guarantee); then `scenario` runs with the controller live (with
    `restart`, a successor's: the one that bound b's pods is stopped first)."""

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        for q in queues():
            await port.create(QUEUES, q)
        for obj in b_pods:
            await port.create(PODS, obj, "b")
        nodes = FakeNodes(port)
        kubelet = asyncio.create_task(nodes.run())
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())

        def running(ns: str) -> set[str]:
            return {
                k
                for k, o in nodes.informer.cache.items()
                if k.startswith(f"{ns}/") and (o.get("status") or {}).get("phase") == "Running"
            }

        await until(lambda: len(running("b")) == len(b_pods), 20, "b to fill the node")
        if restart:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            ctl = Controller(port, load_profile("fairgpu"))
            run = asyncio.create_task(ctl.run())
        try:
            await scenario(port, ctl, nodes, lambda: fake_api.control("state"))
            assert not nodes.violations, nodes.violations  # no GPU ever held by a victim and its preemptor
        finally:
            await stop(port, run, kubelet)

    asyncio.run(asyncio.wait_for(go(), 60))


async def reclaim(port: KubeClient, nodes: FakeNodes, count: int = 2) -> None:
    for i in range(count):
        await port.create(PODS, pod("a", f"a-{i}", ONE_GPU), "a")
    bound = lambda: sum(1 for k, o in nodes.informer.cache.items() if k.startswith("a/") and o["spec"].get("nodeName"))  # noqa: E731
    await until(lambda: bound() == count, 20, "a's pods to be bound")


async def gone(port: KubeClient, ns: str, name: str) -> bool:
    try:
        await port.get(PODS, name, ns)
    except KubeError as err:
        return err.code == 404
    return False


def test_reclaim_evicts_through_the_eviction_api_with_the_victims_grace(fake_api, tmp_path):
    b_pods = [pod("b", f"b-{i}", ONE_GPU) for i in range(8)]

    async def scenario(port, ctl, nodes, state):
        loop = asyncio.get_running_loop()
        started = loop.time()
        await reclaim(port, nodes)
        assert loop.time() - started >= GRACE  # the victims kept their GPUs for their grace period
        evictions = state()["evictions"]
        assert [(e["namespace"], e["code"], e["gracePeriodSeconds"]) for e in evictions] == [("b", 201, GRACE)] * 2
        for e in evictions:
            assert await gone(port, "b", e["name"])
        assert len([k for k in nodes.informer.cache if k.startswith("b/")]) == 6  # nobody else was evicted
        assert ctl.stats.evictions == 2
        events, _ = await port.list(Kind("", "v1", "events", True), "b")
        preempted = {e["involvedObject"]["name"] for e in events if e["reason"] == "Preempted"}
        assert preempted == {e["name"] for e in evictions}

    run(fake_api, tmp_path, b_pods, scenario)


def test_a_disruption_budget_refusal_makes_the_engine_pick_another_victim(fake_api, tmp_path):
    """b's two cheapest pods (lowest priority) are what the engine evicts first, and a budget protects
    them: each eviction is refused with 429, the engine passes them over and takes two others."""
    protected = [with_priority(pod("b", f"keep-{i}", ONE_GPU, {"app": "keep"}), 0) for i in range(2)]
    others = [with_priority(pod("b", f"b-{i}", ONE_GPU), 10) for i in range(6)]

    async def scenario(port, ctl, nodes, state):
        spec = {"minAvailable": 2, "selector": {"matchLabels": {"app": "keep"}}}
        await port.create(PDBS, {"metadata": {"name": "keep"}, "spec": spec}, "b")
        budget = {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 2, "desiredHealthy": 2}
        await port.patch(PDBS, "keep", {"status": budget}, "b", subresource="status")
        await reclaim(port, nodes)
        evictions = [(e["name"], e["code"]) for e in state()["evictions"]]
        refused = [n for n, code in evictions if code == 429]
        evicted = [n for n, code in evictions if code == 201]
        assert refused and set(refused) <= {"keep-0", "keep-1"}, evictions  # tried, and refused
        assert len(evicted) == 2 and not set(evicted) & {"keep-0", "keep-1"}, evictions
        for name in ("keep-0", "keep-1"):  # never deleted, still running
            obj = await port.get(PODS, name, "b")
            assert obj["status"]["phase"] == "Running" and not obj["metadata"].get("deletionTimestamp")
        for name in evicted:
            assert await gone(port, "b", name)

    run(fake_api, tmp_path, protected + others, scenario)


def test_an_elastic_workload_gives_back_only_the_pods_the_engine_names(fake_api, tmp_path):
    """A pod group of 8 with min-members 4 is elastic: it grew onto a's idle guarantee, and a reclaims two
    GPUs by evicting its two newest pods only; the other six run on, in the same engine workload."""
    group = {"fairgpu.io/pod-group": "e", "fairgpu.io/min-members": "4"}
    b_pods = [pod("b", f"e-{i}", ONE_GPU, group) for i in range(8)]

    async def scenario(port, ctl, nodes, state):
        wl = ctl.engine.running["b/group:e"]
        assert wl.workload.min_pods == 4 and len(wl.placed) == 8
        await reclaim(port, nodes)
        evictions = state()["evictions"]
        assert sorted((e["name"], e["code"], e["gracePeriodSeconds"]) for e in evictions) == [
            ("e-6", 201, GRACE),
            ("e-7", 201, GRACE),
        ]
        assert await gone(port, "b", "e-6") and await gone(port, "b", "e-7")
        for i in range(6):
            obj = await port.get(PODS, f"e-{i}", "b")
            assert obj["status"]["phase"] == "Running" and not obj["metadata"].get("deletionTimestamp")
        wl = ctl.engine.running["b/group:e"]  # still the one workload, now of the six pods it runs
        assert wl.workload.pod_names == tuple(f"b/e-{i}" for i in range(6)) and len(wl.placed) == 6
        assert ctl.members["b/group:e"] == wl.workload.pod_names

    run(fake_api, tmp_path, b_pods, scenario)


def test_a_successor_reclaims_from_pods_its_predecessor_bound(fake_api, tmp_path):
    """After a restart the running pods are workloads of their queues again, not just room taken: a queue
    that lent its GPUs before the restart still takes them back afterwards."""
    b_pods = [pod("b", f"b-{i}", ONE_GPU) for i in range(8)]

    async def scenario(port, ctl, nodes, state):
        await reclaim(port, nodes)
        evicted = [e for e in state()["evictions"] if e["code"] == 201]
        assert [(e["namespace"], e["gracePeriodSeconds"]) for e in evicted] == [("b", GRACE)] * 2
        assert ctl.stats.evictions == 2 and ctl.stats.binds == 2  # the successor bound only a's pods

    run(fake_api, tmp_path, b_pods, scenario, restart=True)
