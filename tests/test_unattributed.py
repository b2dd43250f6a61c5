"""Issue 11: a workload created while fairgpu's webhook was down carries no user stamp. Its pods, made by
the Job controller, must not run in the Job controller's name (nor anyone else's) and must not be silently
lost: they wait with a reason saying why and how to fix it, and the owner gets an Event. Over HTTP against
the fake with deploy/'s webhooks and policies (tests/test_perimeter.py's cluster)."""

from __future__ import annotations

import asyncio

from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.identity import UNATTRIBUTED, USER_LABEL, user_label
from fairgpu.k8s.port import NODES, QUEUES
from test_live_scheduling import node, until
from test_perimeter import cluster, gpu_pod, pytestmark, rendered  # noqa: F401 (fixtures and the kubectl skip)

JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"


def job(name: str) -> dict:
    spec = {**gpu_pod("x")["spec"], "restartPolicy": "Never"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "a"},
        "spec": {"template": {"spec": spec}},
    }


def job_pod(owner: dict, name: str) -> dict:
    """What the Job controller creates: the template's metadata and spec, owned by the Job."""
    template = owner["spec"]["template"]
    ref = {"apiVersion": "batch/v1", "kind": "Job", "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}
    meta = {
        **(template.get("metadata") or {}),
        "name": name,
        "namespace": "a",
        "ownerReferences": [{**ref, "controller": True}],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def test_a_job_created_while_fairgpu_was_down_waits_unattributed_and_says_how_to_fix_it(cluster, tmp_path):  # noqa: F811
    fake = cluster.fake
    fake.token("alice-admin", username="alice@example.com", groups=["system:masters"])
    fake.token("jc-token", username=JOB_CONTROLLER, groups=["system:masters"])
    fake.control("device-plugin", enabled=True)
    hook = f"127.0.0.1:{cluster.hook.port}"
    fake.control("service", namespace="fairgpu-system", name="fairgpu-webhook", address="127.0.0.1:9")  # down
    assert cluster.create(job("early"), "alice-admin").returncode == 0  # the workload webhook is Ignore
    fake.control("service", namespace="fairgpu-system", name="fairgpu-webhook", address=hook)  # up again
    assert cluster.create(job("late"), "alice-admin").returncode == 0
    early, late = (cluster.get(f"/apis/batch/v1/namespaces/a/jobs/{n}") for n in ("early", "late"))
    for owner, name in ((early, "early-0"), (late, "late-0")):
        out = cluster.create(job_pod(owner, name), "jc-token")
        assert out.returncode == 0, out.stderr
    stored = {n: cluster.get(f"/api/v1/namespaces/a/pods/{n}")["metadata"] for n in ("early-0", "late-0")}
    # Before: early-0 was stamped as the Job controller's, and ran in its name.
    assert USER_LABEL not in (stored["early-0"].get("labels") or {})
    assert stored["early-0"]["annotations"][UNATTRIBUTED] == "batch/v1/Job/early"
    assert stored["late-0"]["labels"][USER_LABEL] == user_label("alice@example.com")
    assert UNATTRIBUTED not in (stored["late-0"].get("annotations") or {})
    # The mark cannot be taken off by the tenant (the API server's policy).
    out = cluster.kubectl("annotate", "pod", "early-0", "-n", "a", f"{UNATTRIBUTED}-", token="alice-token")
    assert out.returncode != 0 and "only fairgpu changes" in out.stderr
    refused = len(fake.api.state.denied)

    async def go() -> None:
        admin = await KubeClient.connect(fake.kubeconfig(str(tmp_path / "admin"), "admin-token"))
        await admin.create(NODES, node(0))
        await admin.create(QUEUES, {"metadata": {"name": "team-a"}, "spec": {"namespaces": ["a"]}})
        port = await KubeClient.connect(fake.kubeconfig(str(tmp_path / "sa"), "fairgpu-token"))
        ctl = Controller(port, load_profile("fairgpu"))
        task = asyncio.create_task(ctl.run())

        def condition(name: str) -> str:
            conds = ((ctl.pods.cache.get(f"a/{name}") or {}).get("status") or {}).get("conditions") or []
            return next((c["message"] for c in conds if c.get("type") == "PodScheduled"), "")

        try:
            await until(lambda: (ctl.pods.cache.get("a/late-0") or {}).get("spec", {}).get("nodeName"), 20, "late-0")
            await until(lambda: "unattributed" in condition("early-0"), 10, "early-0's reason")
            await asyncio.sleep(1.0)  # a few more passes: early-0 still waits
            assert not ctl.pods.cache["a/early-0"]["spec"].get("nodeName")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await port.close()
            await admin.close()

    asyncio.run(asyncio.wait_for(go(), 60))
    reason = next(c for c in cluster.get("/api/v1/namespaces/a/pods/early-0")["status"]["conditions"])
    assert "Job a/early was created while fairgpu's admission webhook was down" in reason["message"]
    assert "kubectl replace --force" in reason["message"]
    events = cluster.get("/api/v1/namespaces/a/events")["items"]
    on_job = [e for e in events if e["involvedObject"]["kind"] == "Job"]
    assert [(e["involvedObject"]["name"], e["involvedObject"]["apiVersion"], e["reason"]) for e in on_job] == [
        ("early", "batch/v1", "Unattributed")
    ]
    assert on_job[0]["involvedObject"]["uid"] == early["metadata"]["uid"] and on_job[0]["type"] == "Warning"
    on_pod = [e for e in events if e["involvedObject"]["name"] == "early-0" and e["reason"] == "FailedScheduling"]
    assert on_pod and "unattributed" in on_pod[0]["message"]
    assert fake.api.state.denied[refused:] == []  # fairgpu wrote all of it under its RBAC and policies
