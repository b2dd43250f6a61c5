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
