"""`kubectl fairgpu` against the fake apiserver while a real controller schedules: every figure it prints
is what the controller published (Queue status, PodScheduled conditions, HAMi annotations), read back with
the user's kubeconfig; and kubectl itself finds the plugin on PATH."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fairgpu.catalog import load_profile
from fairgpu.cli import app as fairgpu_app
from fairgpu.k8s import hami
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.kubectl import app as plugin
from fairgpu.k8s.port import NODES, PODS, QUEUES, Kind
from fake_kubelet import FakeNodes
from test_live_scheduling import node, pod, until

ROOT = Path(__file__).resolve().parents[1]
WHOLE = {"nvidia.com/gpu": "1"}
HALF = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "20000"}


def run(*args: str, cli=plugin) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One 8-GPU node; org → team-a (guarantee 6 GPUs, namespace a) and team-b (weight 2, namespace b);
    a asks for 8 whole GPUs, b for 2 halves and 3 whole: some of each wait."""
    from fakeapi.server import FakeApiServer

    server = FakeApiServer().start()
    kc = server.kubeconfig(str(tmp_path_factory.mktemp("kc") / "config"))

    async def go() -> dict:
        port = await KubeClient.connect(kc)
        for ns in ("a", "b"):  # the fake, like an API server, keeps pods only in namespaces that exist
            await port.create(Kind("", "v1", "namespaces", False), {"metadata": {"name": ns}})
        await port.create(NODES, node(0))
        await port.create(QUEUES, {"metadata": {"name": "org"}, "spec": {}})
        await port.create(QUEUES, {"metadata": {"name": "team-a"}, "spec": {
            "parent": "org", "namespaces": ["a"], "guaranteed": {"nvidia.com/gpu": 6}}})  # fmt: skip
        await port.create(QUEUES, {"metadata": {"name": "team-b"}, "spec": {
            "parent": "org", "namespaces": ["b"], "weight": 2}})  # fmt: skip
        for i in range(8):
            await port.create(PODS, pod("a", f"a-{i}", WHOLE), "a")
        for i in range(2):
            await port.create(PODS, pod("b", f"half-{i}", HALF), "b")
        for i in range(3):
            await port.create(PODS, pod("b", f"b-{i}", WHOLE), "b")
        nodes = FakeNodes(port)
        kubelet = asyncio.create_task(nodes.run())
        ctl = Controller(port, load_profile("fairgpu"))
        task = asyncio.create_task(ctl.run())

        def pending_explained() -> bool:
            pods = nodes.informer.cache.values()
            waiting = [p for p in pods if not p["spec"].get("nodeName")]
            return bool(waiting) and all(
                any(c["type"] == "PodScheduled" and c["status"] == "False" for c in p["status"].get("conditions", []))
                for p in waiting
            )

        await until(lambda: sum(bool(o["spec"].get("nodeName")) for o in nodes.informer.cache.values()) >= 8, 30,
                    "the node to fill")  # fmt: skip
        await until(pending_explained, 30, "the waiting pods to be explained")
        await asyncio.sleep(ctl.status_every + 0.5)
        ctl.wake.set()
        await until(lambda: "team-b" in ctl.reporter.queue_last, 10, "queue status")
        await asyncio.sleep(0.5)
        # what the API holds now: the controller is stopped so the plugin and the test read the same state
        task.cancel()
        kubelet.cancel()
        await asyncio.gather(task, kubelet, return_exceptions=True)
        state = {
            "pods": (await port.list(PODS))[0],
            "queues": {q["metadata"]["name"]: q for q in (await port.list(QUEUES))[0]},
            "nodes": (await port.list(NODES))[0],
        }
        await port.close()
        return state

    state = asyncio.run(go())
    yield kc, state
    server.stop()


def held(state: dict, ns: str) -> float:
    return sum(
        (0.5 if p["metadata"]["name"].startswith("half") else 1.0)
        for p in state["pods"]
        if p["metadata"]["namespace"] == ns and p["spec"].get("nodeName")
    )


def test_queues_tree_matches_what_the_controller_published(cluster) -> None:
    kc, state = cluster
    rows = json.loads(run("queues", "--kubeconfig", kc, "-o", "json"))["items"]
    assert [r["name"] for r in rows] == ["org", "  team-a", "  team-b"]  # parents before children
    a, b = rows[1], rows[2]
    assert a["usage"] == pytest.approx(held(state, "a")) and b["usage"] == pytest.approx(held(state, "b"))
    assert rows[0]["usage"] == pytest.approx(held(state, "a") + held(state, "b"))
    assert (a["guarantee"], a["weight"], b["weight"], b["limit"]) == (6.0, 1.0, 2.0, float("inf"))
    assert a["borrowed"] == pytest.approx(max(0.0, held(state, "a") - 6))
    assert a["lent"] == pytest.approx(max(0.0, 6 - held(state, "a")))
    for row, ns in ((a, "a"), (b, "b")):
        waiting = sum(1 for p in state["pods"] if p["metadata"]["namespace"] == ns and not p["spec"].get("nodeName"))
        assert row["pending"] == waiting and row["admitted"] + waiting == (8 if ns == "a" else 5)
    published = state["queues"]["team-b"]["status"]
    assert b["fair_share"] == pytest.approx(float(published["fairShare"]["nvidia.com/gpu"]))
    table = run("queues", "--kubeconfig", kc)
    assert "FAIR SHARE" in table and "BORROWED" in table and "team-b" in table
    assert yaml.safe_load(run("queues", "--kubeconfig", kc, "-o", "yaml"))["items"][1]["name"] == "  team-a"


def test_workloads_by_queue_with_positions(cluster) -> None:
    kc, state = cluster
    rows = json.loads(run("workloads", "-A", "--queue", "team-b", "--kubeconfig", kc, "-o", "json"))["items"]
    assert {r["name"] for r in rows} == {"half-0", "half-1", "b-0", "b-1", "b-2"}
    waiting = [r for r in rows if r["state"] == "Pending"]
    bound = {p["metadata"]["name"] for p in state["pods"] if p["spec"].get("nodeName")}
    assert {r["name"] for r in waiting} == {"half-0", "half-1", "b-0", "b-1", "b-2"} - bound
    assert waiting and all(r["position"] and r["estimated_start"] for r in waiting)
    assert sorted(int(r["position"].split("/")[0]) for r in waiting) == list(range(1, len(waiting) + 1))
    only_a = json.loads(run("workloads", "-n", "a", "--kubeconfig", kc, "-o", "json"))["items"]
    assert {r["queue"] for r in only_a} == {"team-a"} and len(only_a) == 8
    result = CliRunner().invoke(plugin, ["workloads", "-A", "--queue", "nope", "--kubeconfig", kc])
    assert result.exit_code == 2 and "'nope' is not a queue" in result.stderr


def test_why_prints_the_engines_explanation(cluster) -> None:
    kc, state = cluster
    waiting = next(p for p in state["pods"] if not p["spec"].get("nodeName"))
    key = f"{waiting['metadata']['namespace']}/{waiting['metadata']['name']}"
    out = run("why", key, "--kubeconfig", kc)
    cond = next(c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled")
    assert out.splitlines() == cond["message"].split("; ")
    assert "position in queue" in out and "estimated start" in out
    bound = next(p for p in state["pods"] if p["spec"].get("nodeName"))
    out = run("why", bound["metadata"]["name"], "-n", bound["metadata"]["namespace"], "--kubeconfig", kc)
    assert f"scheduled on {bound['spec']['nodeName']}" in out


def test_top_gpus_adds_up_hami_annotations(cluster) -> None:
    kc, state = cluster
    rows = json.loads(run("top", "gpus", "--kubeconfig", kc, "-o", "json"))["items"]
    assert len(rows) == 8 and all(r["node"] == "node-00" for r in rows)
    expected: dict[str, int] = defaultdict(int)
    for p in state["pods"]:
        for dev in (
            d for c in hami.decode_devices(p["metadata"].get("annotations", {}).get(hami.ALLOCATED, "")) for d in c
        ):
            expected[dev.uuid] += dev.cores
    assert {r["uuid"]: r["cores_used"] for r in rows} == {r["uuid"]: expected.get(r["uuid"], 0) for r in rows}
    halves = [p for r in rows for p in r["by_pod"] if p["pod"].startswith("b/half")]
    assert all(p["cores"] == 50 for p in halves)
    nodes = json.loads(run("top", "nodes", "--kubeconfig", kc, "-o", "json"))["items"]
    assert nodes[0]["cores"] == f"{sum(expected.values())}/800"


def test_the_same_commands_under_fairgpu(cluster) -> None:
    kc, _ = cluster
    assert "team-a" in run("queues", "--kubeconfig", kc, cli=fairgpu_app)


def test_bad_kubeconfig_and_output_are_one_line(cluster, tmp_path: Path) -> None:
    kc, _ = cluster
    result = CliRunner().invoke(plugin, ["queues", "--kubeconfig", str(tmp_path / "none")])
    assert result.exit_code == 2 and "no such file" in result.stderr and "Traceback" not in result.output
    result = CliRunner().invoke(plugin, ["queues", "--kubeconfig", kc, "-o", "xml"])
    assert result.exit_code == 2 and "--output: 'xml'" in result.stderr


def test_printer_columns_resolve_on_a_published_status(cluster) -> None:
    _, state = cluster
    crd = yaml.safe_load((ROOT / "deploy" / "crd-queues.yaml").read_text())
    columns = {c["name"]: c["jsonPath"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert {"GPUs", "Fair share", "Pending", "Admitted"} <= set(columns)
    queue = state["queues"]["team-a"]
    for name in ("GPUs", "Fair share", "Pending", "Admitted"):
        obj = queue
        for part in columns[name].lstrip(".").replace("\\.", "\0").split("."):
            obj = obj[part.replace("\0", ".")]
        assert obj is not None, name


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_finds_the_plugin(cluster) -> None:
    kc, _ = cluster
    bindir = str(Path(sys.executable).parent)
    if not (Path(bindir) / "kubectl-fairgpu").exists():
        pytest.fail("kubectl-fairgpu is not installed beside python: reinstall the package (make venv)")
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "KUBECONFIG": kc}
    listed = subprocess.run(["kubectl", "plugin", "list"], capture_output=True, text=True, env=env, timeout=60)
    assert "kubectl-fairgpu" in listed.stdout
    proc = subprocess.run(["kubectl", "fairgpu", "queues"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "team-a" in proc.stdout and "FAIR SHARE" in proc.stdout
