"""The dashboard's JSON API and the server's plain endpoints, over HTTP against a replayed scenario."""

from __future__ import annotations

import ast
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from fairgpu.catalog import load_profile
from fairgpu.model import QueueSpec, QueueTree
from fairgpu.observe.history import MAX_SAMPLES, QueueHistory
from fairgpu.observe.server import Background
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim.serve import replay_app

SRC = Path(__file__).resolve().parent.parent / "src" / "fairgpu"


@pytest.fixture(scope="module")
def server():
    app, source = replay_app(scenario_mod.load("demo"), load_profile("fairgpu"), horizon=3600)
    with Background(app) as bg:
        yield bg.url, source


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def doc(url: str) -> dict:
    status, body = get(url)
    assert status == 200, body
    return json.loads(body)


def test_health_and_readiness(server):
    url, _ = server
    assert get(f"{url}/healthz") == (200, b"ok")
    assert get(f"{url}/readyz") == (200, b"ok")


def test_cluster_view_totals_add_up(server):
    url, source = server
    c = doc(f"{url}/api/cluster?t=1200")
    assert c["time"] == 1200 and source.now == 1200
    t = c["totals"]
    assert t["allocated_gpus"] + t["free_gpus"] + t["fragmented_gpus"] == pytest.approx(t["gpus"])
    assert sum(c["idle_gpus"].values()) == pytest.approx(t["gpus"] - t["allocated_gpus"])
    assert sum(m["gpus"] for m in c["models"].values()) == t["gpus"] == 64
    cores = np.array(c["heatmap"]["cores_pct"])
    assert cores.shape == (8, 8) and cores.sum() / 100 == pytest.approx(t["allocated_gpus"])


def test_going_back_in_time_replays_from_the_start(server):
    url, source = server
    late = doc(f"{url}/api/cluster?t=3000")["totals"]
    early = doc(f"{url}/api/cluster?t=60")["totals"]
    assert source.now == 60 and early["running_workloads"] != late["running_workloads"]
    assert doc(f"{url}/api/cluster?t=3000")["totals"] == late  # deterministic: the same state again


def test_node_view_lists_the_pods_on_each_gpu(server):
    url, source = server
    n = doc(f"{url}/api/nodes/l40s-1?t=1800")
    st = source.sched.state
    i = st.node_index["l40s-1"]
    for gpu in n["gpus"]:
        j = gpu["index"]
        assert len(gpu["pods"]) == st.gpu_tasks[i, j]
        assert sum(p["cores"] for p in gpu["pods"]) == gpu["cores_allocated"]
        assert sum(p["memory_mib"] for p in gpu["pods"]) == gpu["memory_allocated_mib"]
    assert get(f"{url}/api/nodes/nope")[0] == 404


def test_queue_view_history_ends_at_the_current_state(server):
    url, source = server
    q = doc(f"{url}/api/queues?t=1800")
    assert q["roots"] == ["research", "batch", "inference", "training"]
    assert q["times"][-1] <= 1800 and len(q["times"]) > 10
    for k, queue in enumerate(q["queues"]):
        hist = queue["history"]["gpu"]
        assert len(hist["usage"]) == len(q["times"])
        assert hist["usage"][-1] == pytest.approx(queue["usage"]["gpu"])
        assert queue["usage"]["gpu"] == pytest.approx(source.sched.view.usage[k, 0])
        assert queue["limit"]["gpu"] is None  # unconstrained


def test_workload_view_is_the_engines_explanation(server):
    url, source = server
    listing = doc(f"{url}/api/workloads?t=1800&queue=batch")
    assert listing["pending"] and all(w["queue"] == "batch" for w in listing["pending"])
    name = listing["pending"][0]["workload"]
    w = doc(f"{url}/api/workloads/{name}?t=1800")
    assert w == {"time": 1800.0, **source.sched.explain(name, 1800.0).to_json()}
    assert get(f"{url}/api/workloads/nope")[0] == 404
    assert get(f"{url}/api/cluster?t=nan")[0] == 400


def test_dashboard_page_and_assets_are_served_locally(server):
    url, _ = server
    status, page = get(f"{url}/")
    assert status == 200 and b"/static/app.js" in page
    for asset in ("app.js", "app.css", "vendor/vega.min.js", "vendor/vega-lite.min.js", "vendor/vega-embed.min.js"):
        assert get(f"{url}/static/{asset}")[0] == 200
    assert b"/static/vendor/vega-lite.min.js" in page  # the chart library is served from here, not a CDN
    assert b"http" not in get(f"{url}/static/app.js")[1].replace(b"http://www.w3.org/2000/svg", b"")


class _FakeSched:
    def __init__(self, *names: str) -> None:
        self.tree = QueueTree([QueueSpec(n) for n in names])
        self.view = SimpleNamespace(usage=np.zeros((len(names), 4)), entitled=np.zeros((len(names), 4)))


def test_history_stays_bounded():
    h = QueueHistory()
    sched = _FakeSched("a", "b")
    for t in range(3 * MAX_SAMPLES):
        h.sample(float(t), sched)
    assert len(h.t) <= MAX_SAMPLES and h.t[0] == 0 and h.t[-1] == 3 * MAX_SAMPLES - 1


def test_history_starts_over_when_the_queues_change():
    """A live scheduler rebuilds its engine when queues come or go: old rows would index other queues."""
    h = QueueHistory()
    h.sample(0.0, _FakeSched("a", "b"))
    h.sample(1.0, _FakeSched("a", "b"))
    h.sample(2.0, _FakeSched("a", "c"))
    assert h.t == [2.0] and h.queues == ["a", "c"]


def test_the_engine_does_not_import_observe():
    for pkg in ("model", "framework", "plugins"):
        for path in (SRC / pkg).rglob("*.py"):
            imports = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)]
            assert not any((n.module or "").startswith("fairgpu.observe") for n in imports), path
    for path in (SRC / "state.py", SRC / "fairness.py"):
        assert "fairgpu.observe" not in path.read_text()


def test_simulate_serve_answers_on_localhost():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = [sys.executable, "-m", "fairgpu.cli", "simulate", "--serve", "--port", str(port), "--horizon", "1h"]
    proc = subprocess.Popen(exe, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(300):  # at most 30 s
            try:
                assert get(f"http://127.0.0.1:{port}/healthz") == (200, b"ok")
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        info = doc(f"http://127.0.0.1:{port}/api/info")
        assert info["profile"] == "fairgpu" and info["horizon"] == 3600 and info["name"] == "demo"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("t=-5", "must be a finite, non-negative number"),
        ("t=abc", "'abc' is not a number"),
        ("t=99999", "past the horizon"),
    ],
)
def test_bad_time_is_answered_400_and_moves_nothing(server, query: str, needle: str):
    url, source = server
    before = doc(f"{url}/api/cluster?t=1200")
    status, body = get(f"{url}/api/cluster?{query}")
    assert status == 400 and needle in json.loads(body)["error"]
    assert source.now == 1200 and doc(f"{url}/api/cluster")["totals"] == before["totals"]


def test_workloads_filter_totals_count_what_matches(server):
    url, source = server
    everything = doc(f"{url}/api/workloads?t=1800")
    batch = doc(f"{url}/api/workloads?t=1800&queue=batch")
    in_batch = [e for e in source.sched.pending.values() if e.workload.queue == "batch"]
    assert batch["pending_total"] == len(in_batch) < everything["pending_total"]
    assert batch["running_total"] == sum(e.workload.queue == "batch" for e in source.sched.running.values())


def test_workloads_are_paged_and_searchable(server):
    url, source = server
    total = doc(f"{url}/api/workloads?t=1800")["pending_total"]
    assert total > 20
    first = doc(f"{url}/api/workloads?t=1800&limit=10")
    second = doc(f"{url}/api/workloads?t=1800&limit=10&offset=10")
    assert len(first["pending"]) == len(second["pending"]) == 10
    assert {w["workload"] for w in first["pending"]}.isdisjoint(w["workload"] for w in second["pending"])
    assert first["pending_total"] == second["pending_total"] == total
    name = second["pending"][3]["workload"]
    found = doc(f"{url}/api/workloads?t=1800&search={name.upper()}")
    assert name in [w["workload"] for w in found["pending"]]
    assert found["pending_total"] == sum(name in e.workload.name for e in source.sched.pending.values())


@pytest.mark.parametrize(
    ("query", "needle"),
    [("queue=nope", "'nope' is not a queue"), ("offset=-1", "offset"), ("limit=0", "limit"), ("limit=x", "limit")],
)
def test_bad_workload_parameters_are_400(server, query: str, needle: str):
    url, _ = server
    status, body = get(f"{url}/api/workloads?{query}")
    assert status == 400 and needle in json.loads(body)["error"]
