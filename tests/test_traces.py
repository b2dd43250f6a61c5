"""Trace loaders: the real openb and Philly-VC files (when ../shared/traces is present), and bad CSVs, which
must fail with one ScenarioError naming file:line and column."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fairgpu.cli import app
from fairgpu.errors import ScenarioError
from fairgpu.sim.traces import load_openb, load_openb_nodes, load_philly

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
OPENB = TRACES / "alibaba-gpu-v2023-openb"
OPENB_NODES = OPENB / "openb_node_list_gpu_node.csv"
OPENB_PODS = OPENB / "openb_pod_list_default.csv"
PHILLY = TRACES / "gavel-philly-vc" / "gavel_philly_vc_seed0.csv"


def need(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"trace file {path.name} not available: ../shared/traces is absent")
    return path


# -- the real files -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openb_nodes():
    return load_openb_nodes(need(OPENB_NODES))


@pytest.fixture(scope="module")
def openb():
    return load_openb(need(OPENB_PODS), need(OPENB_NODES))


@pytest.fixture(scope="module")
def openb_rows() -> dict[str, dict[str, str]]:
    with need(OPENB_PODS).open(newline="") as fh:
        return {row["name"]: row for row in csv.DictReader(fh)}


def test_openb_gpu_nodes(openb_nodes) -> None:
    assert len(openb_nodes) == 1213
    assert sum(len(n.gpus) for n in openb_nodes) == 6212
    by_model = Counter(g.model for n in openb_nodes for g in n.gpus)
    # GPU counts by model as given in the trace's SOURCE.md
    assert by_model == {
        "G2": 4392,
        "T4": 842,
        "P100": 265,
        "G3": 312,
        "V100M16": 195,
        "V100M32": 204,
        "A10": 2,
    }
    assert len({n.name for n in openb_nodes}) == 1213
    assert all(n.cpu_m > 0 and n.memory_mib > 0 for n in openb_nodes)


def test_openb_pods_become_workloads_in_qos_queues(openb) -> None:
    assert len(openb.workloads) == 8152
    assert len(openb.nodes) == 1213
    assert sorted(q.name for q in openb.queues) == ["BE", "Burstable", "Guaranteed", "LS"]
    assert Counter(w.queue for w in openb.workloads) == {
        "LS": 4647,
        "BE": 3398,
        "Burstable": 100,
        "Guaranteed": 7,
    }
    assert all(len(w.pods) == 1 for w in openb.workloads)
    assert all(w.duration is not None and w.duration >= 1 for w in openb.workloads)


def test_openb_pod_shapes(openb, openb_rows) -> None:
    kinds = Counter()
    for wl in openb.workloads:
        row = openb_rows[wl.name]
        pod = wl.pods[0]
        num_gpu, milli = int(row["num_gpu"]), int(row["gpu_milli"])
        assert pod.cpu_m == int(row["cpu_milli"])
        assert pod.memory_mib == int(row["memory_mib"])
        assert wl.submit_time == float(row["creation_time"])
        if num_gpu == 0:
            kinds["cpu-only"] += 1
            assert pod.gpu is None
        elif milli < 1000:
            kinds["sharing"] += 1
            assert pod.gpu.count == 1
            assert pod.gpu.cores == math.ceil(milli / 10)
            assert pod.gpu.mem_pct == pod.gpu.cores  # memory in proportion to the compute share
            assert not pod.gpu.exclusive
        else:
            kinds["whole"] += 1
            assert pod.gpu.count == num_gpu
            assert pod.gpu.exclusive
    assert kinds == {"cpu-only": 1088, "sharing": 3078, "whole": 8152 - 1088 - 3078}


@pytest.fixture(scope="module")
def philly():
    return load_philly(need(PHILLY), 512)


def test_philly_jobs_and_queues(philly) -> None:
    assert len(philly.workloads) == 15264
    assert len(philly.queues) == 15
    assert len(philly.nodes) == 512 // 8
    assert all(len(n.gpus) == 8 for n in philly.nodes)
    assert Counter(w.queue for w in philly.workloads)["6214e9"] == 2000
    assert all(w.duration is not None and w.duration >= 1 for w in philly.workloads)


def test_philly_big_jobs_become_gangs_of_8_gpu_pods(philly) -> None:
    sizes = Counter(sum(p.gpu.count for p in w.pods) for w in philly.workloads)
    assert sizes == {1: 10480, 2: 463, 4: 2044, 7: 2, 8: 1916, 12: 6, 16: 255, 20: 1, 24: 5, 32: 91, 64: 1}
    for wl in philly.workloads:
        counts = [p.gpu.count for p in wl.pods]
        n = sum(counts)
        assert len(counts) == math.ceil(n / 8)
        assert all(c == 8 for c in counts[:-1])
        assert wl.gang == (n > 8)


def test_philly_cli_smoke_run() -> None:
    need(PHILLY)
    result = CliRunner().invoke(
        app, ["simulate", "--trace", f"philly:{PHILLY}", "--gpus", "256", "--horizon", "1d", "--json"]
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    runs = doc["runs"]
    assert [r["profile"] for r in runs] == ["kube-default", "fairgpu"]
    for r in runs:
        assert r["horizon_s"] == 86400
        assert len(r["queues"]) == 15
        assert 0 < r["utilization"] <= 1
        assert sum(q["submitted"] for q in r["queues"].values()) > 0


# -- synthetic CSVs -------------------------------------------------------------------------------------

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
POD_HEADER = ",".join(POD_COLUMNS)
PHILLY_HEADER = "vc,job_seq,job_type,needs_data_dir,total_steps,arrival_time_s,num_gpus,iso_duration_s_v100"


def write(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def nodes_csv(tmp_path: Path) -> Path:
    return write(tmp_path, "nodes.csv", NODE_HEADER, "n0,32000,262144,8,V100M32", "n1,32000,262144,2,T4")


def test_openb_small_files(tmp_path: Path, nodes_csv: Path) -> None:
    pods = write(
        tmp_path,
        "pods.csv",
        POD_HEADER,
        "p0,4000,8192,1,465,,LS,Running,10,110,20",
        "p1,4000,8192,1,5,V100M32|A10,BE,Running,0,50,",
        "p2,4000,8192,2,1000,,,Running,0,100,0",
    )
    sc = load_openb(pods, nodes_csv)
    p0, p1, p2 = sc.workloads
    assert p0.pods[0].gpu.cores == 47  # ceil(465 / 10)
    assert p0.duration == 90  # deletion − scheduled
    assert p1.pods[0].gpu.cores == 1  # ceil(5 / 10)
    assert p1.pods[0].gpu_include == ("V100M32", "A10")
    assert p1.duration == 50  # never scheduled: deletion − creation
    assert p2.queue == "default"  # no QoS
    assert p2.pods[0].gpu.count == 2
    assert [q.name for q in sc.queues] == ["BE", "LS", "default"]
    assert sc.nodes[0].gpus[0].memory_mib == 32768


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        ((NODE_HEADER.replace(",model", ""), "n0,32000,262144,8"), "missing column 'model'"),
        ((NODE_HEADER, "n0,32000,262144,8,V100M32", "n1,lots,262144,2,T4"), ":3: cpu_milli: 'lots'"),
        ((NODE_HEADER, "n0,32000,262144,-8,V100M32"), ":2: gpu: '-8'"),
        ((NODE_HEADER, "n0,32000,262144,8,"), ":2: model"),
    ],
    ids=["missing-column", "non-numeric", "negative", "gpus-without-model"],
)
def test_openb_bad_node_csv(tmp_path: Path, lines: tuple[str, ...], needle: str) -> None:
    path = write(tmp_path, "nodes.csv", *lines)
    with pytest.raises(ScenarioError) as info:
        load_openb_nodes(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(path))
    assert needle in msg


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("p1,4000,8192,1,abc,,LS,Running,0,100,0", ":3: gpu_milli: 'abc'"),
        ("p1,4000,-1,1,500,,LS,Running,0,100,0", ":3: memory_mib: '-1'"),
        ("p1,4000,8192,1,500,,LS,Running,0,,0", ":3: deletion_time: ''"),
        ("p1,4000,8192,1,500,,LS,Running,0,100,200", ":3: deletion_time"),
    ],
    ids=["non-numeric", "negative", "empty", "deleted-before-start"],
)
def test_openb_bad_pod_csv(tmp_path: Path, nodes_csv: Path, row: str, needle: str) -> None:
    path = write(tmp_path, "pods.csv", POD_HEADER, "p0,4000,8192,1,1000,,LS,Running,0,100,0", row)
    with pytest.raises(ScenarioError) as info:
        load_openb(path, nodes_csv)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(path))
    assert needle in msg


def test_openb_pod_csv_missing_column(tmp_path: Path, nodes_csv: Path) -> None:
    path = write(tmp_path, "pods.csv", POD_HEADER.replace(",qos", ""), "p0,4000,8192,1,1000,,Running,0,100,0")
    with pytest.raises(ScenarioError, match="missing column 'qos'") as info:
        load_openb(path, nodes_csv)
    assert str(info.value).startswith(str(path))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such file"):
        load_philly(tmp_path / "nope.csv", 8)


def philly_csv(tmp_path: Path, *rows: str) -> Path:
    return write(tmp_path, "philly.csv", PHILLY_HEADER, *rows)


def test_philly_small_file(tmp_path: Path) -> None:
    sizes = [1, 7, 8, 12, 16, 64]
    rows = [f"vc{n % 2},{i},m,0,100,{10 * i},{n},{3600 + i}" for i, n in enumerate(sizes)]
    sc = load_philly(philly_csv(tmp_path, *rows), 64)
    assert [[p.gpu.count for p in w.pods] for w in sc.workloads] == [
        [1],
        [7],
        [8],
        [8, 4],
        [8, 8],
        [8] * 8,
    ]
    assert [w.gang for w in sc.workloads] == [False, False, False, True, True, True]
    assert all(p.gpu.exclusive for w in sc.workloads for p in w.pods)
    assert [w.submit_time for w in sc.workloads] == [0, 10, 20, 30, 40, 50]
    assert [w.duration for w in sc.workloads] == [3600, 3601, 3602, 3603, 3604, 3605]
    assert sorted(q.name for q in sc.queues) == ["vc0", "vc1"]
    assert [w.name for w in sc.workloads][:2] == ["vc1-0", "vc1-1"]
    assert len(sc.nodes) == 8


@pytest.mark.parametrize("gpus", [0, 4, 12, 100])
def test_philly_gpus_must_be_a_multiple_of_8(tmp_path: Path, gpus: int) -> None:
    path = philly_csv(tmp_path, "vc,0,m,0,100,0,1,3600")
    with pytest.raises(ScenarioError, match=rf"^--gpus: {gpus} must be a positive multiple of 8"):
        load_philly(path, gpus)


def test_philly_gpus_not_multiple_of_8_on_the_cli(tmp_path: Path) -> None:
    path = philly_csv(tmp_path, "vc,0,m,0,100,0,1,3600")
    result = CliRunner().invoke(app, ["simulate", "--trace", f"philly:{path}", "--gpus", "12", "--json"])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.strip() == "error: --gpus: 12 must be a positive multiple of 8"


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("vc,1,m,0,100,soon,1,3600", ":3: arrival_time_s: 'soon'"),
        ("vc,1,m,0,100,-5,1,3600", ":3: arrival_time_s: '-5'"),
        ("vc,1,m,0,100,0,0,3600", ":3: num_gpus: '0'"),
        ("vc,1,m,0,100,0,x,3600", ":3: num_gpus: 'x'"),
        ("vc,1,m,0,100,0,16,3600", ":3: num_gpus: 16 is more than the cluster's 8 GPUs"),
    ],
    ids=["non-numeric", "negative", "zero-gpus", "non-numeric-gpus", "bigger-than-cluster"],
)
def test_philly_bad_csv(tmp_path: Path, row: str, needle: str) -> None:
    path = philly_csv(tmp_path, "vc,0,m,0,100,0,1,3600", row)
    with pytest.raises(ScenarioError) as info:
        load_philly(path, 8)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(path))
    assert needle in msg


def test_philly_missing_column(tmp_path: Path) -> None:
    path = write(tmp_path, "philly.csv", PHILLY_HEADER.replace(",num_gpus", ""), "vc,0,m,0,100,0,3600")
    with pytest.raises(ScenarioError, match="missing column 'num_gpus'"):
        load_philly(path, 8)
