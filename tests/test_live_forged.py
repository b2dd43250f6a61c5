"""Session 13 (safe9): what a tenant may still write on its own pods after admission (docs/deploy.md's
Security: only the user, queue, allocation and control keys are immutable) must never make fairgpu free a GPU
the pod still holds, nor let it skip its queue."""

from __future__ import annotations

import asyncio

import pytest

from audit import audit
from chaos import chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import PODS
from fairgpu.k8s.translate import pod_info
from live_setup import ONE, pods_now, setup
from test_live_scheduling import stop, until


@pytest.mark.parametrize(
    "edit",
    [
        {"annotations": {"fairgpu.io/expected-runtime": "forever"}},
        {"labels": {"fairgpu.io/min-members": "many"}},
    ],
    ids=["expected-runtime", "min-members"],
)
def test_a_running_pods_unreadable_edit_never_frees_its_gpu(fake_api, tmp_path, edit):
    """a/p0 runs on the only GPU; its owner then writes a value fairgpu cannot read on a key it may still change.
    Before: the pod became unreadable, the pass took it for gone, freed its GPU and bound b/b0 to the same card."""
    fake_api.control("device-plugin")

    async def go() -> Controller:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=1)
        await port.create(PODS, chaos_pod("a", "p0", ONE), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "p0's bind")
            await port.patch(PODS, "p0", {"metadata": edit}, "a")
            await port.create(PODS, chaos_pod("b", "b0", ONE), "b")
            await until(lambda: "b/b0" in ctl.pods.cache, 10, "b0 in the cache")
            await asyncio.sleep(0.5)  # a few passes: b0 had every chance to be placed
        finally:
            await stop(port, run)
        return ctl

    ctl = asyncio.run(asyncio.wait_for(go(), 30))
    pods = pods_now(fake_api)
    assert not pods["b/b0"]["spec"].get("nodeName"), "b0 was bound onto the GPU a/p0 still holds"
    report = audit(fake_api.api.store, fake_api.control("requests")["requests"], {}, set())
    assert not report.overcommit, report.overcommit
    assert ctl.stats.binds == 1


def test_an_unreadable_gang_size_or_runtime_is_a_problem_that_names_its_key():
    """What the fix keeps: a pending pod with such a value is still refused, saying which key (the webhook
    refuses it at CREATE by the same problem); a bound one is still read, so it stays accounted."""
    pod = chaos_pod("a", "p", ONE, {"fairgpu.io/min-members": "many"})
    pod["metadata"]["annotations"] = {"fairgpu.io/expected-runtime": "forever"}
    p = pod_info(pod)
    assert p.problem is not None
    assert "metadata.labels[fairgpu.io/min-members]: 'many' is not a number" in p.problem
    assert "metadata.annotations[fairgpu.io/expected-runtime]: 'forever' is not a duration" in p.problem
    pod["spec"]["nodeName"] = "node-000"
    assert pod_info(pod).spec.gpu is not None


def test_a_pod_with_scheduling_gates_is_left_alone_until_they_are_removed(fake_api, tmp_path):
    """kube-scheduler leaves a gated pod alone (its PreEnqueue), and the API server refuses its Binding (409).
    Before: fairgpu placed b/g0 at every pass, annotated it, took and released the node lock and sent a Binding
    that was refused, booking the GPU (and free to evict for it) each time. Now it waits until its gates are
    gone, then binds."""
    fake_api.control("device-plugin")

    async def go() -> Controller:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=1)
        gated = chaos_pod("b", "g0", ONE)
        gated["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
        await port.create(PODS, gated, "b")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: "b/g0" in ctl.pods.cache and ctl.stats.cycles + ctl.stats.bind_failures >= 1, 10, "g0")
            await asyncio.sleep(1.5)  # past the retry interval: a refused bind would have been tried again
            g0 = "/api/v1/namespaces/b/pods/g0"
            touched = [r for r in fake_api.control("requests")["requests"] if r["path"] in (g0, f"{g0}/binding")]
            assert not [r for r in touched if r["verb"] != "GET"], touched
            await port.patch(PODS, "g0", {"spec": {"schedulingGates": []}}, "b")
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "g0's bind once ungated")
        finally:
            await stop(port, run)
        return ctl

    ctl = asyncio.run(asyncio.wait_for(go(), 30))
    assert ctl.stats.bind_failures == 0
    assert pods_now(fake_api)["b/g0"]["spec"].get("nodeName") == "node-000"


def test_a_pod_cannot_join_another_users_gang_to_be_charged_to_them(fake_api, tmp_path):
    """Inside a queue, fairness between users reads the webhook's stamp, which nobody can forge. A gang is one
    workload of one user: before, alice's pod labelled into bob's pod group (any pod of the namespace may carry
    the label) ran as part of bob's gang, charged to bob. Now each user's pods of a group are a gang of their
    own: bob's runs without z, alice's once it has two members; a successor adopts them as two workloads."""
    fake_api.control("device-plugin")
    group = {"fairgpu.io/pod-group": "g", "fairgpu.io/min-members": "2"}

    def of(user: str, name: str) -> dict:
        p = chaos_pod("a", name, ONE, {**group, "fairgpu.io/user": user})
        p["metadata"]["annotations"] = {"fairgpu.io/user-name": user}
        return p

    async def go() -> Controller:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=4)
        await port.create(PODS, of("bob", "g-0"), "a")
        await port.create(PODS, of("alice", "z"), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.cycles >= 1 and "a/z" in ctl.pods.cache, 10, "a cycle")
            await asyncio.sleep(0.5)
            assert ctl.stats.binds == 0
            await port.create(PODS, of("bob", "g-1"), "a")  # bob's own second member: his gang runs, without z
            await until(lambda: ctl.stats.binds == 2 and not ctl.inflight, 10, "bob's gang")
            assert not ctl.pods.cache["a/z"]["spec"].get("nodeName")
            assert sorted(e.workload.user for e in ctl.engine.running.values()) == ["bob"]
            await port.create(PODS, of("alice", "z2"), "a")
            await until(lambda: ctl.stats.binds == 4 and not ctl.inflight, 10, "alice's gang")
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            successor = Controller(port, load_profile("fairgpu"))
            run = asyncio.create_task(successor.run())
            await until(lambda: successor.stats.cycles >= 1, 10, "the successor's first cycle")
            running = successor.engine.running.values()
            assert sorted((e.workload.user, len(e.workload.pods)) for e in running) == [("alice", 2), ("bob", 2)]
        finally:
            await stop(port, run)
        return ctl

    asyncio.run(asyncio.wait_for(go(), 30))


def test_the_controller_itself_refuses_a_queue_the_pods_namespace_may_not_use(fake_api, tmp_path):
    """The webhook refuses such a label at CREATE; the controller checks it again at every submission, so a pod
    that got past admission (a namespace the webhooks exclude, a queue that dropped the namespace since) never
    skips into another tenant's queue. b/x names team a's queue: it waits, saying why; b/y, in its own, runs.
    (Holds.)"""
    fake_api.control("device-plugin")

    async def go() -> Controller:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        await port.create(PODS, chaos_pod("b", "x", ONE, {"fairgpu.io/queue": "q-a"}), "b")
        await port.create(PODS, chaos_pod("b", "y", ONE), "b")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "y's bind")
            await until(lambda: ctl.reporter.last.get("b/x"), 10, "x's reason")
        finally:
            await stop(port, run)
        return ctl

    ctl = asyncio.run(asyncio.wait_for(go(), 30))
    pods = pods_now(fake_api)
    assert pods["b/y"]["spec"].get("nodeName") and not pods["b/x"]["spec"].get("nodeName")
    assert ctl.reporter.last["b/x"] == "namespace b may not use queue 'q-a'"
