"""The chaos soak, short: a few hundred pods against two replicas, an unreliable API server and a restarting
admission webhook, audited from the fake's own history (tests/chaos.py, tests/audit.py). The long one is
bench/soak.py."""

from __future__ import annotations

import asyncio

import pytest

from audit import audit
from chaos import Chaos, chaos_pod, run_chaos
from chaos_webhook import POD_WEBHOOKS, ChaosWebhook
from fairgpu.errors import KubeError
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.port import PODS
from fakeapi.process import FakeProcess


def test_short_chaos_soak_has_no_violations(tmp_path):
    # The fake in a process of its own: the soak measures the scheduler's timing, not the fake's.
    fake = FakeProcess().start()
    try:
        kubeconfig = fake.kubeconfig(str(tmp_path / "kc"))
        # About 30 s on an idle machine; the limit leaves room for a loaded one.
        report = asyncio.run(run_chaos(fake, kubeconfig, Chaos(seed=7, pods=300, arrival_s=15.0, limit_s=120.0)))
    finally:
        fake.stop()
    assert report["violations"] == dict.fromkeys(report["violations"], 0), report
    assert report["finished"], report
    faults = report["faults"]
    assert faults["leader_kills"] >= 1 and faults["node_deletions"] >= 1, faults
    assert faults.get("after 0", 0) + faults.get("after 500", 0) > 0, faults  # answers were lost
    assert faults["webhook_restarts"] == 2 and faults["webhook_refusals"] > 0, faults
    assert report["binds"] >= 250, report


@pytest.mark.parametrize("policy", [None, "Ignore"])
def test_a_pod_created_while_the_webhook_is_down_is_refused_or_reported(fake_api, tmp_path, policy):
    """With deploy/'s failurePolicy a pod created while the webhook is down is refused; with Ignore (the
    one-line change that would let tenants' pods in unchecked) it is stored, and the auditor reports it."""

    async def go() -> list[str]:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        hook = await asyncio.to_thread(ChaosWebhook, tmp_path, {"q-a": ("a",)})
        try:
            await hook.register(fake_api, port, policy)
            await port.create(PODS, chaos_pod("a", "up", {"nvidia.com/gpu": "1"}), "a")
            await asyncio.to_thread(hook.stop)
            try:
                await port.create(PODS, chaos_pod("a", "down", {"nvidia.com/gpu": "1"}), "a")
            except KubeError as err:
                assert err.code == 500 and "failed calling webhook" in err.message, err
                return ["refused"]
            return ["stored"]
        finally:
            await port.close()

    outcome = asyncio.run(asyncio.wait_for(go(), 60))
    calls = fake_api.call(lambda: list(fake_api.api.admission.calls))
    report = audit(fake_api.api.store, [], {}, set(), (calls, POD_WEBHOOKS, {"a"}))
    if policy is None:
        assert outcome == ["refused"] and not report.unchecked_pods, report.unchecked_pods
    else:
        assert outcome == ["stored"] and len(report.unchecked_pods) == 1, report.unchecked_pods
        assert "a/down" in report.unchecked_pods[0]
