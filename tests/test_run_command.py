"""`fairgpu run` as a process against the fake apiserver: it binds a GPU pod, answers its probes and serves
the dashboard."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from fairgpu.k8s.hami import ALLOCATED
from test_live_scheduling import node, pod


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, method: str = "GET", body: dict | None = None) -> dict | str:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        raw = resp.read().decode()
        return json.loads(raw) if resp.headers.get("Content-Type") == "application/json" else raw


@pytest.mark.parametrize("elector", ["thread", "process"])
def test_run_binds_and_serves_probes(fake_api, tmp_path, elector):
    api = fake_api.url
    _request(f"{api}/api/v1/nodes", "POST", node(0))
    _request(
        f"{api}/apis/fairgpu.io/v1alpha1/queues", "POST", {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}}
    )
    _request(f"{api}/api/v1/namespaces/a/pods", "POST", pod("a", "p", {"nvidia.com/gpu": "1"}))
    health, metrics, dash = _free_port(), _free_port(), _free_port()
    cmd = [sys.executable, "-m", "fairgpu.cli", "run", "--kubeconfig", fake_api.kubeconfig(str(tmp_path / "kc"))]
    cmd += ["--health-host", "127.0.0.1", "--health-port", str(health), "--identity", "t", "--lease-namespace", "x"]
    cmd += ["--metrics-host", "127.0.0.1", "--metrics-port", str(metrics), "--dashboard-port", str(dash)]
    cmd += ["--elector", elector]
    log = tmp_path / "stdout"
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        got: dict = {}
        while time.monotonic() < deadline:
            got = _request(f"{api}/api/v1/namespaces/a/pods/p")  # type: ignore[assignment]
            if got["spec"].get("nodeName"):
                break
            time.sleep(0.1)
        assert got["spec"].get("nodeName") == "node-00", proc.stderr.read() if proc.poll() is not None else ""
        assert got["metadata"]["annotations"][ALLOCATED].startswith("GPU-00-")
        assert _request(f"http://127.0.0.1:{health}/healthz") == "ok"
        assert _request(f"http://127.0.0.1:{health}/readyz") == "ok"
        assert "fairgpu_" in str(_request(f"http://127.0.0.1:{metrics}/metrics"))
        with pytest.raises(urllib.error.HTTPError):  # probes, metrics and dashboard each on their own port
            _request(f"http://127.0.0.1:{health}/api/info")
        # the dashboard and its API, read from the live engine, on 127.0.0.1 by default
        assert "<html" in str(_request(f"http://127.0.0.1:{dash}/")).lower()
        info = _request(f"http://127.0.0.1:{dash}/api/info")
        assert info == {"time": info["time"], "name": api, "profile": "fairgpu", "horizon": None, "queues": ["q"]}
        running = _request(f"http://127.0.0.1:{dash}/api/workloads")["running"]  # type: ignore[index]
        assert [(w["workload"], w["queue"]) for w in running] == [("a/p", "q")]
        lease = _request(f"{api}/apis/coordination.k8s.io/v1/namespaces/x/leases/fairgpu")
        assert lease["spec"]["holderIdentity"] == "t"
        lines = log.read_text()  # the log reaches stdout (where an elector process would write too)
        assert "fairgpu.k8s.leader: t became the leader" in lines and "fairgpu t: probes on" in lines, lines
    finally:
        proc.terminate()
        proc.wait(10)


def test_run_refuses_an_exposed_dashboard_without_auth(tmp_path):
    """Finding 9: the dashboard listened on 0.0.0.0 without auth. Exposing it now needs --dashboard-auth."""
    from typer.testing import CliRunner

    from fairgpu.cli import app

    result = CliRunner().invoke(app, ["run", "--dashboard-host", "0.0.0.0"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "--dashboard-auth" in result.output


def test_run_refuses_a_trusted_identities_file_with_two_names(tmp_path):
    """A mounted list whose file holds two lines is refused at start, naming the file (exit 2): the API
    server's policy compares whole values, so neither name would be trusted there."""
    from typer.testing import CliRunner

    from fairgpu.cli import app

    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "ops").write_text("ops\nmallory")
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n")
    args = ["run", "--kubeconfig", str(kubeconfig), "--trusted-identities", str(trusted)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "/ops: one identity per file, found 2 lines" in result.output, result.output


def test_admission_answers_during_a_slow_scheduling_cycle(fake_api, tmp_path, monkeypatch):
    """Finding 4: `fairgpu run` served the webhook on the loop the engine cycle blocks, so a long cycle
    delayed admission past its 5 s timeout. With every cycle made to hold the loop for 3 s, the webhook
    still answers within a second."""
    import asyncio
    import contextlib
    import ssl
    import threading

    from fairgpu.catalog import load_profile
    from fairgpu.k8s import app as live
    from fairgpu.k8s.controller import Controller
    from test_webhook import gpu_pod, make_cert, review

    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    make_cert(cert, key)
    step = Controller.step
    cycles: list[float] = []

    async def slow_step(self: Controller) -> None:
        cycles.append(time.monotonic())
        time.sleep(3.0)  # a deliberately slow engine cycle, holding the controller's loop
        await step(self)

    monkeypatch.setattr(Controller, "step", slow_step)
    _request(f"{fake_api.url}/api/v1/nodes", "POST", node(0))
    _request(f"{fake_api.url}/api/v1/namespaces/a/pods", "POST", pod("a", "p", {"nvidia.com/gpu": "1"}))
    hook_port = _free_port()
    listen = live.Listen(
        ("127.0.0.1", _free_port()),
        ("127.0.0.1", _free_port()),
        ("127.0.0.1", _free_port()),
        False,
        False,
        ("127.0.0.1", hook_port),
    )
    loop = asyncio.new_event_loop()
    args = (fake_api.kubeconfig(str(tmp_path / "kc")), load_profile("fairgpu"), "fairgpu", "t", False, "x", listen)
    task = loop.create_task(live.run(*args, (str(cert), str(key))))

    def serve() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not cycles and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cycles, "no scheduling cycle started"
        time.sleep(0.5)  # inside the 3 s cycle now
        body = json.dumps(review(gpu_pod({"nvidia.com/gpu": "1"}))).encode()
        req = urllib.request.Request(
            f"https://127.0.0.1:{hook_port}/validate", data=body, headers={"Content-Type": "application/json"}
        )
        started = time.monotonic()
        with urllib.request.urlopen(req, timeout=2.5, context=ssl.create_default_context(cafile=str(cert))) as resp:
            assert json.loads(resp.read())["response"]["uid"]  # an answer (a refusal: no stamp), in time
        assert time.monotonic() - started < 1.0
        assert time.monotonic() - cycles[-1] < 3.0  # answered while that cycle still held the loop
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(15)
        loop.close()
