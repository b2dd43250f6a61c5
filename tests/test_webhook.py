"""The admission webhook over HTTPS with real AdmissionReview JSON (admission.k8s.io/v1), served as
`fairgpu run` serves it: on its own thread, with a certificate that reloads when its files rotate."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.request

import pytest

from fairgpu.k8s.identity import DEFAULT_CONTROLLERS, FAIRGPU_SA, Trust, TrustedIdentities, user_label
from fairgpu.k8s.webhook import webhook_app
from fairgpu.k8s.webhook_server import WebhookServer
from fakeapi.patches import json_patch

QUEUES = {"team-a": ("a",), "open": ()}
UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
TRUST = Trust.of(FAIRGPU_SA, ["system:serviceaccount:kube-system:hami-device-plugin"], DEFAULT_CONTROLLERS)
LABEL = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def review(
    obj: dict,
    namespace: str = "a",
    user: str = "alice@example.com",
    operation: str = "CREATE",
    old: dict | None = None,
    kind: tuple[str, str, str] = ("", "v1", "Pod"),
) -> dict:
    """An AdmissionReview as the apiserver sends it."""
    group, version, k = kind
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": UID,
            "kind": {"group": group, "version": version, "kind": k},
            "resource": {"group": group, "version": version, "resource": k.lower() + "s"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": user, "uid": "014fbff9a07c", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        },
    }


def gpu_pod(limits: dict, labels: dict | None = None, scheduler: str | None = None, **meta) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    metadata: dict = {"generateName": "job-", **meta}
    if labels is not None:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def stamped(user: str) -> tuple[dict, dict]:
    return {"fairgpu.io/user": user_label(user)}, {"fairgpu.io/user-name": user}


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not available to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    make_cert(d / "cert.pem", d / "key.pem")
    return str(d / "cert.pem"), str(d / "key.pem")


def make_cert(cert, key, cn: str = "127.0.0.1") -> None:
    args = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={cn}"]
    subprocess.run(
        ["openssl", *args, "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def hook(tls):
    server = WebhookServer(lambda: webhook_app(QUEUES.get, "fairgpu", TRUST), "127.0.0.1", 0, *tls).start()
    yield server
    server.stop()


def post(server: WebhookServer, path: str, body: dict, cafile: str, timeout: float = 5) -> dict:
    req = urllib.request.Request(
        f"https://127.0.0.1:{server.port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout, context=ssl.create_default_context(cafile=cafile)) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


@pytest.fixture
def call(hook, tls):
    return lambda path, body: post(hook, path, body, tls[0])


def patched(obj: dict, response: dict) -> dict:
    assert response["patchType"] == "JSONPatch"
    return json_patch(obj, json.loads(base64.b64decode(response["patch"])))


def denied(resp: dict) -> str:
    assert not resp["allowed"] and resp["status"]["code"] == 403
    return resp["status"]["message"]


def test_mutation_sets_scheduler_user_and_hami_defaults(call):
    labels = {"fairgpu.io/user": "mallory"}
    obj = gpu_pod({"nvidia.com/gpu": "2"}, labels=labels, scheduler="default-scheduler")
    doc = call("/mutate", review(obj))
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    resp = doc["response"]
    assert resp["uid"] == UID and resp["allowed"]
    out = patched(obj, resp)
    assert out["spec"]["schedulerName"] == "fairgpu"
    # the pod's own label is overwritten, and the full name kept beside it
    assert (out["metadata"]["labels"], out["metadata"]["annotations"]) == stamped("alice@example.com")
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"}
    # gpumem alone implies one GPU; no labels map yet
    obj = gpu_pod({"nvidia.com/gpumem": "4000"})
    out = patched(obj, call("/mutate", review(obj, user="system:serviceaccount:ml:runner"))["response"])
    assert out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpucores" not in out["spec"]["containers"][0]["resources"]["limits"]
    assert out["metadata"]["labels"]["fairgpu.io/user"].startswith("system.serviceaccount.ml.runner-")
    assert call("/validate", review(out, user="system:serviceaccount:ml:runner"))["response"]["allowed"]


def test_pods_without_gpus_are_left_alone(call):
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}}
    assert call("/mutate", review(obj))["response"] == {"uid": UID, "allowed": True}
    web = {**obj, "spec": {**obj["spec"], "nodeName": "n1"}}  # not a GPU pod: not ours to place
    assert call("/validate", review(web))["response"]["allowed"]


def test_validation_rejects_bad_requests_and_foreign_queues(call):
    def admitted(pod: dict, namespace: str = "a", user: str = "alice@example.com") -> dict:
        out = patched(pod, call("/mutate", review(pod, namespace, user))["response"])
        return call("/validate", review(out, namespace, user))["response"]

    assert admitted(gpu_pod({"nvidia.com/gpu": "1"}, labels={"fairgpu.io/queue": "team-a"}))["allowed"]
    bad = denied(admitted(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10Gi"})))
    assert "spec.containers[0].resources.nvidia.com/gpumem" in bad
    pct = denied(admitted(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"})))
    assert "nvidia.com/gpumem-percentage: 150 must be between 0 and 100" in pct
    # HAMi's webhook admits cores over 100 and its scheduler clamps them to 100
    assert admitted(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}))["allowed"]
    foreign = admitted(gpu_pod({"nvidia.com/gpu": "1"}, labels={"fairgpu.io/queue": "team-a"}), namespace="b")
    assert "namespace b may not use queue 'team-a'" in denied(foreign)
    missing = admitted(gpu_pod({"nvidia.com/gpu": "1"}, labels={"fairgpu.io/queue": "nope"}))
    assert "does not exist" in denied(missing)
    assert admitted(gpu_pod({"nvidia.com/gpu": "1"}, labels={"fairgpu.io/queue": "open"}), namespace="b")["allowed"]


# -- finding 2: no bypass -----------------------------------------------------------------------------------
ALLOCATION = {
    "hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,81920,100:;",
    "hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,81920,100:;",
}


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: p["spec"].update(nodeName="node-1"), id="nodeName"),
        pytest.param(lambda p: p["metadata"]["annotations"].update(ALLOCATION), id="hami-allocation"),
        pytest.param(lambda p: p["metadata"]["labels"].update({"hami.io/vgpu-node": "node-1"}), id="hami-label"),
        pytest.param(lambda p: p["metadata"]["annotations"].update({"fairgpu.io/gang-admitted": "true"}), id="gang"),
        pytest.param(lambda p: p["spec"].update(schedulerName="default-scheduler"), id="other-scheduler"),
        pytest.param(lambda p: p["metadata"]["labels"].update(stamped("bob")[0]), id="user-label"),
        pytest.param(lambda p: p["metadata"]["annotations"].update(stamped("bob")[1]), id="user-name"),
    ],
)
def test_a_tenant_cannot_skip_the_queue_or_forge_what_fairgpu_reads(call, change):
    """Whatever the mutating webhook did, the object the validating one sees after later mutations (or a
    mutating webhook that was skipped) is refused if it names its node, its GPUs or its gang state, or
    carries someone else's name. fairgpu itself may write all of it."""
    labels, annotations = stamped("alice@example.com")
    pod = gpu_pod({"nvidia.com/gpu": "1"}, labels=dict(labels), scheduler="fairgpu", annotations=dict(annotations))
    assert call("/validate", review(pod))["response"]["allowed"]
    change(pod)
    assert "may not" in denied(call("/validate", review(pod))["response"]) or "scheduled by" in denied(
        call("/validate", review(pod))["response"]
    )
    if pod["spec"].get("schedulerName") == "fairgpu":  # fairgpu's service account, and the trusted, may
        assert call("/validate", review(pod, user=FAIRGPU_SA))["response"]["allowed"]


def test_hami_scheduling_hints_stay_open_to_users(call):
    labels, annotations = stamped("alice@example.com")
    annotations = {**annotations, "hami.io/gpu-scheduler-policy": "spread"}
    pod = gpu_pod({"nvidia.com/gpu": "1"}, labels=labels, scheduler="fairgpu", annotations=annotations)
    assert call("/validate", review(pod))["response"]["allowed"]


# -- findings 5 and 6: UPDATE --------------------------------------------------------------------------------
def running_pod(queue: str = "gone") -> dict:
    labels, annotations = stamped("alice@example.com")
    pod = gpu_pod(
        {"nvidia.com/gpu": "1"},
        labels={**labels, "fairgpu.io/queue": queue, "app": "x"},
        scheduler="fairgpu",
        annotations={**annotations, **ALLOCATION, "fairgpu.io/gang-admitted": "true"},
        finalizers=["batch.kubernetes.io/job-tracking"],
        name="p",
    )
    pod["spec"]["nodeName"] = "node-1"
    return pod


def test_updates_that_do_not_touch_scheduling_pass_even_after_the_queue_is_gone(call):
    """Finding 5: a queue deleted under running pods must not freeze them (the Job controller removes its
    finalizer; others label them). The queue 'gone' does not exist."""
    old = running_pod()
    for change in (
        lambda p: p["metadata"].pop("finalizers"),
        lambda p: p["metadata"]["labels"].update(app="y"),
        lambda p: p["metadata"].setdefault("annotations", {}).update({"example.com/note": "hi"}),
    ):
        new = json.loads(json.dumps(old))
        change(new)
        resp = call("/validate", review(new, user=JOB_CONTROLLER, operation="UPDATE", old=old))["response"]
        assert resp["allowed"], resp


def test_identity_and_allocation_are_immutable_after_create(call):
    """Finding 6: the user label cannot be changed on UPDATE (it was read again at the next rebuild)."""
    old = running_pod("team-a")
    for field, key, value in (
        ("labels", "fairgpu.io/user", user_label("bob")),
        ("annotations", "fairgpu.io/user-name", "bob"),
        ("labels", "fairgpu.io/queue", "open"),
        ("annotations", "fairgpu.io/gang-admitted", None),
        ("annotations", "hami.io/vgpu-devices-allocated", "GPU-2,NVIDIA,81920,100:;"),
    ):
        new = json.loads(json.dumps(old))
        if value is None:
            new["metadata"][field].pop(key)
        else:
            new["metadata"][field][key] = value
        message = denied(call("/validate", review(new, operation="UPDATE", old=old))["response"])
        assert f"metadata.{field}[{key}]" in message
        assert call("/validate", review(new, user=FAIRGPU_SA, operation="UPDATE", old=old))["response"]["allowed"]
    # HAMi's device plugin (a trusted identity) consumes the allocation
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"]["hami.io/bind-phase"] = "success"
    device_plugin = "system:serviceaccount:kube-system:hami-device-plugin"
    assert call("/validate", review(new, user=device_plugin, operation="UPDATE", old=old))["response"]["allowed"]


def test_user_labels_never_collide_and_are_always_valid():
    names = ["a@b.com", "a_b.com", "x" * 70 + "1", "x" * 70 + "2", "-bob-", "system:serviceaccount:ml:runner", "é"]
    labels = [user_label(n) for n in names]
    assert len(set(labels)) == len(names)
    assert all(len(v) <= 63 and LABEL.match(v) for v in labels)
    assert user_label("a@b.com").startswith("a_b.com-") and user_label("-bob-").startswith("bob-")


# -- pods made by controllers ------------------------------------------------------------------------------
def job(template_labels: dict | None = None) -> dict:
    template = {"spec": gpu_pod({"nvidia.com/gpu": "1"})["spec"]}
    if template_labels is not None:
        template["metadata"] = {"labels": template_labels}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"}, "spec": {"template": template}}


JOB = ("batch", "v1", "Job")


def test_pods_of_a_job_are_charged_to_whoever_created_the_job(call):
    """Finding 6: controllers' pods were all the job controller's. The Job's template is stamped with its
    creator at CREATE (a forged template label overwritten) and keeps it on UPDATE; the pod the job
    controller makes from it keeps that user; a pod a user makes with someone else's stamp does not."""
    created = patched(
        job({"fairgpu.io/user": "mallory"}),
        call("/mutate", review(job({"fairgpu.io/user": "mallory"}), kind=JOB))["response"],
    )
    meta = created["spec"]["template"]["metadata"]
    assert (meta["labels"], meta["annotations"]) == stamped("alice@example.com")
    forged = json.loads(json.dumps(created))
    forged["spec"]["template"]["metadata"]["labels"]["fairgpu.io/user"] = user_label("bob")
    forged["spec"]["template"]["metadata"]["annotations"]["fairgpu.io/user-name"] = "bob"
    resp = call("/mutate", review(forged, user="bob", operation="UPDATE", old=created, kind=JOB))["response"]
    assert patched(forged, resp)["spec"]["template"]["metadata"] == meta

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": json.loads(json.dumps(meta)),
        "spec": created["spec"]["template"]["spec"],
    }
    made = patched(pod, call("/mutate", review(pod, user=JOB_CONTROLLER))["response"])
    assert (made["metadata"]["labels"], made["metadata"]["annotations"]) == stamped("alice@example.com")
    assert call("/validate", review(made, user=JOB_CONTROLLER))["response"]["allowed"]
    by_bob = patched(pod, call("/mutate", review(pod, user="bob"))["response"])
    assert by_bob["metadata"]["annotations"]["fairgpu.io/user-name"] == "bob"
    assert "may not" in denied(call("/validate", review(made, user="bob"))["response"])


PT, RAY = ("spec", "pytorchReplicaSpecs"), ("spec", "rayClusterSpec")


@pytest.mark.parametrize(
    ("kind", "obj", "paths"),
    [
        (
            ("batch", "v1", "CronJob"),
            {"spec": {"jobTemplate": {"spec": {"template": {}}}}},
            [("spec", "jobTemplate", "spec", "template")],
        ),
        (
            ("kubeflow.org", "v1", "PyTorchJob"),
            {"spec": {"pytorchReplicaSpecs": {"Master": {"template": {}}, "Worker": {"template": {"metadata": {}}}}}},
            [
                ("spec", "pytorchReplicaSpecs", "Master", "template"),
                ("spec", "pytorchReplicaSpecs", "Worker", "template"),
            ],
        ),
        (
            ("jobset.x-k8s.io", "v1alpha2", "JobSet"),
            {"spec": {"replicatedJobs": [{"template": {"spec": {"template": {}}}}]}},
            [("spec", "replicatedJobs", "0", "template", "spec", "template")],
        ),
        (
            ("ray.io", "v1", "RayJob"),
            {"spec": {"rayClusterSpec": {"headGroupSpec": {"template": {}}, "workerGroupSpecs": [{"template": {}}]}}},
            [
                ("spec", "rayClusterSpec", "headGroupSpec", "template"),
                ("spec", "rayClusterSpec", "workerGroupSpecs", "0", "template"),
            ],
        ),
    ],
)
def test_training_job_templates_are_stamped(call, kind, obj, paths):
    obj = {"apiVersion": f"{kind[0]}/{kind[1]}", "kind": kind[2], "metadata": {"name": "t"}, **obj}
    out = patched(obj, call("/mutate", review(obj, kind=kind))["response"])
    for path in paths:
        node = out
        for part in path:
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert node["metadata"]["annotations"]["fairgpu.io/user-name"] == "alice@example.com"


# -- off the scheduling path, certificate rotation ---------------------------------------------------------
def test_webhook_answers_while_the_scheduling_loop_is_blocked(hook, tls):
    """Finding 4: a long scheduling cycle delayed admission past its timeout. The server runs on its own
    thread: with this thread's event loop blocked for 3 s by a synchronous 'cycle', it answers in well
    under a second."""

    async def cycle_while_admitting() -> float:
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        body = review(gpu_pod({"nvidia.com/gpu": "1"}))
        answered = loop.run_in_executor(None, lambda: (post(hook, "/validate", body, tls[0], 2.0), time.monotonic()))
        time.sleep(3.0)  # a synchronous engine cycle holding this loop
        _, at = await answered
        return at - t0

    assert asyncio.run(cycle_while_admitting()) < 1.0


def test_certificate_reloads_when_its_files_rotate(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not available")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    make_cert(cert, key, "first")
    server = WebhookServer(lambda: webhook_app(QUEUES.get), "127.0.0.1", 0, str(cert), str(key), 0.05).start()
    try:

        def served_cn() -> str:
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            import socket

            with socket.create_connection(("127.0.0.1", server.port), 5) as raw, ctx.wrap_socket(raw) as s:
                der = s.getpeercert(binary_form=True)
            out = subprocess.run(
                ["openssl", "x509", "-inform", "DER", "-noout", "-subject"], input=der, capture_output=True, timeout=30
            )
            return out.stdout.decode()

        assert "first" in served_cn()
        new_cert, new_key = tmp_path / "n.crt", tmp_path / "n.key"
        make_cert(new_cert, new_key, "second")
        new_key.replace(key)  # the key first: a pair that does not match yet keeps the old certificate
        time.sleep(0.2)
        assert "first" in served_cn()
        new_cert.replace(cert)
        deadline = time.monotonic() + 5
        while "second" not in served_cn() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "second" in served_cn() and server.cert.reloads == 1
        assert post(server, "/validate", review(gpu_pod({"nvidia.com/gpu": "1"})), str(cert))["response"]
    finally:
        server.stop()


def kubelet_update(base, data: dict[str, str], version: int) -> None:
    """What the kubelet does to a ConfigMap volume on an edit: the new files in a new timestamped directory,
    `..data` swapped to it in one rename, a symlink per new key, the old keys' links and directory removed."""
    old = os.readlink(base / "..data") if (base / "..data").is_symlink() else None
    real = base / f"..2026_12_01_09_00_0{version}.1"
    real.mkdir()
    for k, v in data.items():
        (real / k).write_text(v)
    os.symlink(real.name, base / "..data_tmp")
    os.replace(base / "..data_tmp", base / "..data")
    for k in data:
        if not (base / k).is_symlink():
            os.symlink(f"..data/{k}", base / k)
    for link in base.iterdir():
        if link.is_symlink() and not link.name.startswith("..") and link.name not in data:
            link.unlink()
    if old is not None:
        shutil.rmtree(base / old)


def test_the_trusted_identities_follow_the_mounted_configmap_without_a_restart(tls, tmp_path, caplog):
    """The mounted ConfigMap edited (as the kubelet swaps it): whom the webhook lets rewrite a pod's user
    changes without a restart. An edit that leaves a file holding two names keeps the whole last good list
    (the name it adds is not trusted) and the log names the file; fixing it brings the new list in."""
    hami, ops, eve = "system:serviceaccount:kube-system:hami-device-plugin", "ops@example.com", "eve@example.com"
    mounted = tmp_path / "trusted"
    mounted.mkdir()
    kubelet_update(mounted, {"hami": hami}, 1)
    identities = TrustedIdentities(str(mounted), Trust.of(FAIRGPU_SA))
    app = lambda: webhook_app(QUEUES.get, "fairgpu", identities)  # noqa: E731
    server = WebhookServer(app, "127.0.0.1", 0, *tls, reload_every=0.05, watch=(identities.check,)).start()
    labels, annotations = stamped("alice@example.com")
    old = gpu_pod({"nvidia.com/gpu": "1"}, labels=labels, name="p", annotations=annotations)
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"]["fairgpu.io/user-name"] = "carol@example.com"

    def allowed(user: str) -> bool:
        return post(server, "/validate", review(new, user=user, operation="UPDATE", old=old), tls[0])["response"][
            "allowed"
        ]

    def until(cond) -> bool:
        deadline = time.monotonic() + 5
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.05)
        return cond()

    try:
        assert allowed(hami) and not allowed(ops) and not allowed(eve)
        kubelet_update(mounted, {"hami": hami, "ops": ops}, 2)
        assert until(lambda: allowed(ops)) and allowed(hami) and not allowed(eve)
        with caplog.at_level(logging.ERROR, logger="fairgpu.k8s.identity"):
            kubelet_update(mounted, {"hami": hami, "ops": f"{ops}\n{eve}", "eve": eve}, 3)
            assert until(lambda: identities.problem is not None)
        assert "ops: one identity per file, found 2 lines" in identities.problem
        assert any("last good list stays" in r.message and "/ops:" in r.message for r in caplog.records)
        assert allowed(hami) and allowed(ops) and not allowed(eve)  # the last good list, whole
        kubelet_update(mounted, {"hami": hami, "eve": eve}, 4)
        assert until(lambda: allowed(eve)) and not allowed(ops) and identities.problem is None
    finally:
        server.stop()


def test_a_failing_listener_never_stops_the_trusted_identities_reloads(tmp_path):
    """`on_news` (the Events of `fairgpu run`) is told from the webhook's reloader, which also renews the serving
    certificate: a listener that raises must cost neither the reloads nor the last good list."""
    mounted = tmp_path / "trusted"
    mounted.mkdir()
    kubelet_update(mounted, {"hami": "hami"}, 1)
    identities = TrustedIdentities(str(mounted), Trust.of(FAIRGPU_SA))
    told: list[bool] = []

    def listener(problem: bool, message: str) -> None:
        told.append(problem)
        raise RuntimeError("the reporter's loop is gone")

    identities.on_news = listener
    kubelet_update(mounted, {"hami": "hami", "ops": "ops\neve"}, 2)
    assert identities.check() is False and "ops: one identity per file" in (identities.problem or "")
    assert identities.check() is False and told == [True]  # the same problem is told once
    assert identities().trusted == {"hami"}
    kubelet_update(mounted, {"hami": "hami", "eve": "eve"}, 3)
    assert identities.check() is True and identities().trusted == {"hami", "eve"} and told == [True, False]


def test_the_mounted_list_adds_to_the_identities_and_controllers_given_on_the_command_line(tmp_path):
    """`--trusted-identity` and `--pod-controller` are always kept beside the mounted list, at start and after
    each reload: trusted and controllers are each the union of both, never what they share; the reload's news
    names them."""
    mounted = tmp_path / "trusted"
    mounted.mkdir()
    kubelet_update(mounted, {"hami": "hami", "controller.jobs": "jobs"}, 1)
    identities = TrustedIdentities(str(mounted), Trust.of(FAIRGPU_SA, ["ops"], ["rs"]))
    assert identities().trusted == {"ops", "hami"} and identities().controllers == {"rs", "jobs"}
    told: list[str] = []
    identities.on_news = lambda problem, message: told.append(message)
    kubelet_update(mounted, {"eve": "eve", "controller.sets": "sets"}, 2)
    assert identities.check() is True
    assert identities().trusted == {"ops", "eve"} and identities().controllers == {"rs", "sets"}
    assert told == [f"trusted identities reloaded from {mounted}: eve, ops; workload controllers: rs, sets"]


def test_a_job_whose_template_has_no_metadata_is_stamped_at_create_and_left_alone_at_update():
    """A Job's pod template without metadata: at CREATE the webhook adds it, carrying the creator; at an UPDATE
    of a Job whose template carried no user before either, there is nothing to keep, and the patch is empty
    (no metadata added for nothing)."""
    from fairgpu.k8s.identity import USER_ANNOTATION
    from fairgpu.k8s.webhook import AdmissionRequest, mutate_workload

    job = {"metadata": {"name": "train"}, "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}
    kind = {"group": "batch", "version": "v1", "kind": "Job"}

    def patch(operation: str) -> list[dict]:
        req = AdmissionRequest(uid="1", kind=kind, operation=operation, userInfo={"username": "alice"}, object=job)
        req.old_object = job if operation == "UPDATE" else None
        return mutate_workload(req, Trust())

    created = patch("CREATE")
    assert created[0] == {"op": "add", "path": "/spec/template/metadata", "value": {}}
    assert {"op": "add", "path": f"/spec/template/metadata/annotations/{USER_ANNOTATION.replace('/', '~1')}",
            "value": "alice"} in created  # fmt: skip
    assert patch("UPDATE") == []
