"""The admission webhook over HTTPS with real AdmissionReview JSON (admission.k8s.io/v1)."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import subprocess

import aiohttp
import pytest
from aiohttp import web

from fairgpu.k8s.webhook import label_value, tls_context, webhook_app
from fakeapi.patches import json_patch

QUEUES = {"team-a": ("a",), "open": ()}


def review(obj: dict, namespace: str = "a", user: str = "alice@example.com", operation: str = "CREATE") -> dict:
    """An AdmissionReview as the apiserver sends it."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": user, "uid": "014fbff9a07c", "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def gpu_pod(limits: dict, labels: dict | None = None, scheduler: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    meta: dict = {"generateName": "job-"}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not available to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    args = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
    subprocess.run(
        ["openssl", *args, "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", d / "key.pem", "-out", d / "cert.pem"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(d / "cert.pem"), str(d / "key.pem")


def call(tls, path: str, body: dict) -> dict:
    async def go() -> dict:
        runner = web.AppRunner(webhook_app(QUEUES.get))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls_context(*tls))
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        trust = ssl.create_default_context(cafile=tls[0])
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"https://127.0.0.1:{port}{path}", json=body, ssl=trust) as resp,
            ):
                assert resp.status == 200
                return await resp.json()
        finally:
            await runner.cleanup()

    return asyncio.run(asyncio.wait_for(go(), 20))


def patched(obj: dict, response: dict) -> dict:
    assert response["patchType"] == "JSONPatch"
    return json_patch(obj, json.loads(base64.b64decode(response["patch"])))


def test_mutation_sets_scheduler_user_and_hami_defaults(tls):
    obj = gpu_pod({"nvidia.com/gpu": "2"}, labels={"fairgpu.io/user": "mallory"}, scheduler="default-scheduler")
    doc = call(tls, "/mutate", review(obj))
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    resp = doc["response"]
    assert resp["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and resp["allowed"]
    out = patched(obj, resp)
    assert out["spec"]["schedulerName"] == "fairgpu"
    assert out["metadata"]["labels"]["fairgpu.io/user"] == "alice_example.com"  # the pod's own label is overwritten
    assert out["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"}
    # gpumem alone implies one GPU; no labels map yet
    obj = gpu_pod({"nvidia.com/gpumem": "4000"})
    out = patched(obj, call(tls, "/mutate", review(obj, user="system:serviceaccount:ml:runner"))["response"])
    assert out["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpucores" not in out["spec"]["containers"][0]["resources"]["limits"]
    assert out["metadata"]["labels"] == {"fairgpu.io/user": "system.serviceaccount.ml.runner"}


def test_pods_without_gpus_are_left_alone(tls):
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}}
    resp = call(tls, "/mutate", review(obj))["response"]
    assert resp == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_validation_rejects_bad_requests_and_foreign_queues(tls):
    ok = call(tls, "/validate", review(gpu_pod({"nvidia.com/gpu": "1"}, labels={"fairgpu.io/queue": "team-a"})))
    assert ok["response"]["allowed"]
    bad = call(tls, "/validate", review(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10Gi"})))
    assert not bad["response"]["allowed"] and bad["response"]["status"]["code"] == 403
    assert "spec.containers[0].resources.nvidia.com/gpumem" in bad["response"]["status"]["message"]
    pct = call(tls, "/validate", review(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"})))
    assert "nvidia.com/gpumem-percentage: 150 must be between 0 and 100" in pct["response"]["status"]["message"]
    clamped = call(tls, "/validate", review(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"})))
    assert clamped["response"]["allowed"]  # HAMi's webhook admits it and its scheduler clamps to 100
    foreign = review(gpu_pod({"nvidia.com/gpu": "1"}, labels={"fairgpu.io/queue": "team-a"}), namespace="b")
    resp = call(tls, "/validate", foreign)["response"]
    assert not resp["allowed"] and "namespace b may not use queue 'team-a'" in resp["status"]["message"]
    missing = call(tls, "/validate", review(gpu_pod({"nvidia.com/gpu": "1"}, labels={"fairgpu.io/queue": "nope"})))
    assert "does not exist" in missing["response"]["status"]["message"]
    anyone = review(gpu_pod({"nvidia.com/gpu": "1"}, labels={"fairgpu.io/queue": "open"}), namespace="b")
    assert call(tls, "/validate", anyone)["response"]["allowed"]


def test_label_value_is_always_a_valid_label():
    assert label_value("x" * 100 + "@") == "x" * 63
    assert label_value("-bob-") == "bob"
