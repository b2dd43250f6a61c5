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
from test_webhook import gpu_pod, patched, review


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
