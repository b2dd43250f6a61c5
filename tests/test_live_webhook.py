"""The admission webhook as `fairgpu run` serves it: HTTPS with the given certificate, and queue checks
answered from the controller's live queue cache (a queue created, or deleted, after start-up counts)."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.request

from test_run_command import _free_port, _request
from test_webhook import gpu_pod, kubelet_update, patched, review, stamped


def test_run_serves_the_webhook_over_tls_from_its_live_queue_cache(fake_api, tmp_path, tls):
    api = fake_api.url
    queues = f"{api}/apis/fairgpu.io/v1alpha1/queues"
    _request(queues, "POST", {"metadata": {"name": "team-a"}, "spec": {"namespaces": ["a"]}})
    health, hook = _free_port(), _free_port()
    cmd = [sys.executable, "-m", "fairgpu.cli", "run", "--kubeconfig", fake_api.kubeconfig(str(tmp_path / "kc"))]
    cmd += ["--health-host", "127.0.0.1", "--health-port", str(health), "--identity", "t", "--lease-namespace", "x"]
    cmd += ["--webhook-port", str(hook), "--tls-cert", tls[0], "--tls-key", tls[1]]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    trust = ssl.create_default_context(cafile=tls[0])  # only our certificate: the handshake proves it is served

    def post(path: str, review_doc: dict) -> dict:
        req = urllib.request.Request(
            f"https://127.0.0.1:{hook}{path}",
            data=json.dumps(review_doc).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5, context=trust) as resp:
            return json.loads(resp.read())["response"]

    def answer(path: str, namespace: str, queue: str | None = None) -> dict:
        """The webhook's answer for a GPU pod; /validate sees the pod as /mutate left it, as in a cluster."""
        labels = None if queue is None else {"fairgpu.io/queue": queue}
        pod = gpu_pod({"nvidia.com/gpu": "1"}, labels)
        mutated = post("/mutate", review(pod, namespace=namespace))
        if path == "/mutate":
            return mutated
        return post("/validate", review(patched(pod, mutated), namespace=namespace))

    def eventually(path: str, namespace: str, queue: str, allowed: bool) -> dict:
        deadline = time.monotonic() + 20
        while True:
            try:
                got = answer(path, namespace, queue)
                if got["allowed"] == allowed:
                    return got
            except OSError:  # not listening yet
                got = {}
            assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, got
            time.sleep(0.1)

    try:
        eventually("/validate", "a", "team-a", True)  # once the queue cache has synced
        denied = answer("/validate", "b", "team-a")
        assert not denied["allowed"] and "namespace b may not use queue 'team-a'" in denied["status"]["message"]
        missing = answer("/validate", "b", "late")
        assert not missing["allowed"] and "queue 'late' does not exist" in missing["status"]["message"]
        assert answer("/mutate", "a")["patchType"] == "JSONPatch"
        # Queues created and deleted after start-up: the answers follow the cache.
        _request(queues, "POST", {"metadata": {"name": "late"}, "spec": {"namespaces": ["b"]}})
        eventually("/validate", "b", "late", True)
        _request(f"{queues}/team-a", "DELETE")
        gone = eventually("/validate", "a", "team-a", False)
        assert "queue 'team-a' does not exist" in gone["status"]["message"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_broken_trusted_identities_edit_is_an_event_on_its_configmap(fake_api, tmp_path, tls):
    """`fairgpu run --trusted-identities`: an edit of the mounted ConfigMap that leaves a file with two names
    keeps the last good list whole (the webhook still refuses the name it adds) and is told as a Warning
    Event on the ConfigMap naming the file and the problem; the fix is told as a Normal Event naming whom
    it trusts now. Checked over HTTP: the webhook's answers and the fake's Events."""
    hami, ops, eve = "system:serviceaccount:kube-system:hami-device-plugin", "ops@example.com", "eve@example.com"
    mounted = tmp_path / "trusted"
    mounted.mkdir()
    job = {"controller.job-controller": "system:serviceaccount:kube-system:job-controller"}  # as deploy/ lists it
    kubelet_update(mounted, {"hami": hami, **job}, 1)
    hook = _free_port()
    cmd = [sys.executable, "-m", "fairgpu.cli", "run", "--kubeconfig", fake_api.kubeconfig(str(tmp_path / "kc"))]
    cmd += ["--health-port", str(_free_port()), "--identity", "t", "--lease-namespace", "x", "--health-host"]
    cmd += ["127.0.0.1", "--webhook-port", str(hook), "--tls-cert", tls[0], "--tls-key", tls[1]]
    cmd += ["--trusted-identities", str(mounted)]  # the ConfigMap deploy/ mounts there, by default
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    context = ssl.create_default_context(cafile=tls[0])
    labels, annotations = stamped("alice@example.com")
    old = gpu_pod({"nvidia.com/gpu": "1"}, labels=labels, name="p", annotations=annotations)
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"]["fairgpu.io/user-name"] = "carol@example.com"

    def allowed(user: str) -> bool | None:
        """Whether the webhook lets `user` rewrite the pod's user; None while it is not listening yet."""
        doc = review(new, user=user, operation="UPDATE", old=old)
        req = urllib.request.Request(
            f"https://127.0.0.1:{hook}/validate", json.dumps(doc).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5, context=context) as resp:
                return json.loads(resp.read())["response"]["allowed"]
        except OSError:
            return None

    def events() -> list[dict]:
        return _request(f"{fake_api.url}/api/v1/namespaces/fairgpu-system/events")["items"]  # type: ignore[index]

    def until(cond, what: str):
        deadline = time.monotonic() + 20
        while not (got := cond()):
            assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)
        return got

    def reason(name: str) -> list[dict]:
        return [e for e in events() if e["reason"] == name]

    try:
        until(lambda: allowed(hami), "the webhook")
        assert allowed(ops) is False and events() == []  # nothing to tell at start
        kubelet_update(mounted, {"hami": hami, "ops": f"{ops}\n{eve}", "eve": eve, **job}, 2)
        [warning] = until(lambda: reason("TrustedIdentitiesInvalid"), "the Warning")
        assert warning["type"] == "Warning" and warning["source"]["component"] == "fairgpu"
        configmap = {"namespace": "fairgpu-system", "name": "fairgpu-trusted-identities", "uid": ""}
        assert warning["involvedObject"] == {"apiVersion": "v1", "kind": "ConfigMap", **configmap}
        assert f"{mounted}/ops: one identity per file, found 2 lines" in warning["message"], warning["message"]
        assert "the last good list stays" in warning["message"]
        time.sleep(0.5)  # reloads meanwhile: the same problem is told once, and trust is the last good list
        assert len(reason("TrustedIdentitiesInvalid")) == 1 and not reason("TrustedIdentitiesReloaded")
        assert allowed(hami) and allowed(eve) is False and allowed(ops) is False
        kubelet_update(mounted, {"hami": hami, "eve": eve, **job}, 3)
        [fixed] = until(lambda: reason("TrustedIdentitiesReloaded"), "the Normal event")
        assert fixed["type"] == "Normal" and eve in fixed["message"] and ops not in fixed["message"]
        assert allowed(eve) and allowed(ops) is False
    finally:
        proc.terminate()
        proc.wait(10)


def test_run_refuses_a_malformed_trusted_identities_configmap(fake_api, tmp_path):
    cmd = [sys.executable, "-m", "fairgpu.cli", "run", "--kubeconfig", fake_api.kubeconfig(str(tmp_path / "kc"))]
    cmd += ["--trusted-identities", str(tmp_path), "--trusted-identities-configmap", "trusted"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "--trusted-identities-configmap: expected NAMESPACE/NAME, got 'trusted'" in done.stderr, done.stderr
