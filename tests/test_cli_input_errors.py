"""Every input error an operator met (issue 16) is one line on stderr naming the file, line or field, with
exit status 2, and nothing runs first: no traceback, no silent acceptance, no error after a long run."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from tests.test_cli import SMALL, assert_one_error_line, invoke, small_doc, write

NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,262144,2,T4\nn1,32000,262144,4,V100M32\n"
POD_HEAD = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)
POD_OK = "p0,1000,1024,1,1000,,LS,Running,0,100,0\n"
PHILLY_HEAD = "vc,job_seq,job_type,total_steps,arrival_time_s,num_gpus,iso_duration_s_v100\n"


def run_error(*args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert_one_error_line(result.stdout, result.stderr)
    return result.stderr.strip()


def openb(tmp_path: Path, pods: str, nodes: str = NODES_CSV) -> str:
    n = write(tmp_path, "nodes.csv", nodes)
    p = write(tmp_path, "pods.csv", pods)
    return run_error("simulate", "--trace", f"openb:{p}", "--nodes", str(n), "--json")


# -- scenario files ------------------------------------------------------------------------------------


def test_duplicate_yaml_key_is_refused_with_its_line(tmp_path: Path) -> None:
    text = SMALL.replace("horizon: 2h\n", "horizon: 2h\nhorizon: 9h\n")
    err = run_error("simulate", "--scenario", str(write(tmp_path, "s.yaml", text)), "--json")
    assert "line 3: key 'horizon' is given twice" in err and "s.yaml" in err


def test_duplicate_key_inside_a_flow_mapping(tmp_path: Path) -> None:
    text = SMALL.replace("{name: team-b}", "{name: team-b, name: team-c}")
    err = run_error("simulate", "--scenario", str(write(tmp_path, "s.yaml", text)), "--json")
    assert "key 'name' is given twice" in err


@pytest.mark.parametrize(
    ("where", "needle"),
    [
        (lambda d: d["cluster"]["nodes"][0].__setitem__("memory", 512), "cluster.nodes[0].memory: 512 needs a unit"),
        (lambda d: d["cluster"]["nodes"][0].__setitem__("gpu_memory", "80"), "cluster.nodes[0].gpu_memory: '80'"),
        (lambda d: d["workloads"][0]["requests"].__setitem__("memory", 512), "workloads[0].requests.memory: 512"),
        (lambda d: d["queues"][0].__setitem__("guaranteed", {"memory": 512}), "queues[0].guaranteed: 512"),
        (lambda d: d["queues"][1].__setitem__("limit", {"memory": "64"}), "queues[1].limit: '64'"),
    ],
    ids=["node-memory", "gpu-memory", "request-memory", "queue-guarantee", "queue-limit"],
)
def test_bare_memory_number_needs_a_unit(tmp_path: Path, where, needle: str) -> None:
    doc = small_doc()
    where(doc)
    err = run_error("simulate", "--scenario", str(write(tmp_path, "s.yaml", doc)), "--json")
    assert needle in err and "Mi or" in err


def test_zero_memory_needs_no_unit(tmp_path: Path) -> None:
    doc = small_doc()
    doc["workloads"][0]["requests"]["memory"] = 0
    assert invoke("simulate", "--scenario", str(write(tmp_path, "s.yaml", doc)), "--json").exit_code == 0


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d["cluster"]["nodes"][0].__setitem__("count", 100_000_000), "cluster.nodes[0].count:"),
        (lambda d: d["workloads"][0].__setitem__("count", 10**12), "workloads[0].count:"),
        (lambda d: d["workloads"][0].__setitem__("priority", 10**20), "workloads[0].priority:"),
        (lambda d: d["workloads"][0].__setitem__("pods", 10**9), "workloads[0].pods:"),
        (
            lambda d: d["cluster"]["nodes"].extend(
                [dict(d["cluster"]["nodes"][0], name=f"g{i}", count=60_000) for i in range(2)]
            ),
            "120,001 nodes in all",
        ),
    ],
    ids=["nodes", "workloads", "priority", "pods", "total-nodes"],
)
def test_sizes_past_the_limits_are_refused(tmp_path: Path, change, needle: str) -> None:
    doc = small_doc()
    change(doc)
    err = run_error("simulate", "--scenario", str(write(tmp_path, "s.yaml", doc)), "--json")
    assert needle in err


def test_guarantee_larger_than_the_cluster(tmp_path: Path) -> None:
    doc = small_doc()
    doc["queues"][1]["guaranteed"] = {"nvidia.com/gpu": 100}
    err = run_error("simulate", "--scenario", str(write(tmp_path, "s.yaml", doc)), "--json")
    assert "queues[1].guaranteed.nvidia.com/gpu: 100 is more than the whole cluster has (4 GPUs)" in err


def test_guarantee_the_size_of_the_cluster_is_fine(tmp_path: Path) -> None:
    doc = small_doc()
    doc["queues"][1]["guaranteed"] = {"nvidia.com/gpu": 4}
    assert invoke("simulate", "--scenario", str(write(tmp_path, "s.yaml", doc)), "--json").exit_code == 0


# -- trace CSVs ----------------------------------------------------------------------------------------


def test_openb_pod_larger_than_any_node(tmp_path: Path) -> None:
    err = openb(tmp_path, POD_HEAD + POD_OK + "p1,1000,1024,8,1000,,LS,Running,0,100,0\n")
    assert "pods.csv:3:" in err and "nodes.csv" in err and "8" in err


def test_duplicate_node_names_name_the_file_and_both_lines(tmp_path: Path) -> None:
    err = openb(tmp_path, POD_HEAD + POD_OK, NODES_CSV + "n0,1000,1000,0,\n")
    assert "nodes.csv:4: sn: 'n0' is also on line 2" in err


def test_duplicate_pod_names(tmp_path: Path) -> None:
    err = openb(tmp_path, POD_HEAD + POD_OK + POD_OK)
    assert "pods.csv:3: name: 'p0' is also on line 2" in err


def test_binary_csv_names_the_file(tmp_path: Path) -> None:
    n = write(tmp_path, "nodes.csv", NODES_CSV)
    p = tmp_path / "pods.csv"
    p.write_bytes(POD_HEAD.encode() + b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x00garbage\n")
    err = run_error("simulate", "--trace", f"openb:{p}", "--nodes", str(n), "--json")
    assert "pods.csv" in err and "not a" in err


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_non_finite_numbers_in_a_csv(tmp_path: Path, value: str) -> None:
    err = openb(tmp_path, POD_HEAD + f"p0,1000,1024,1,1000,,LS,Running,0,{value},0\n")
    assert f"pods.csv:2: deletion_time: '{value}' is not a finite number" in err


def test_extra_values_in_a_row(tmp_path: Path) -> None:
    err = openb(tmp_path, POD_HEAD + "p0,1000,1024,1,1000,,LS,Running,0,100,0,surprise\n")
    assert "pods.csv:2: more fields than the header's 11 columns" in err


def test_unknown_column(tmp_path: Path) -> None:
    err = openb(tmp_path, POD_HEAD.replace("\n", ",owner\n") + POD_OK.replace("\n", ",me\n"))
    assert "pods.csv: unknown column 'owner'" in err


def test_pod_deleted_before_it_was_created(tmp_path: Path) -> None:
    err = openb(tmp_path, POD_HEAD + "p0,1000,1024,1,1000,,LS,Running,500,100,\n")
    assert "pods.csv:2: deletion_time is before the pod was created" in err


def test_pod_scheduled_before_it_was_created(tmp_path: Path) -> None:
    err = openb(tmp_path, POD_HEAD + "p0,1000,1024,1,1000,,LS,Running,500,900,100\n")
    assert "pods.csv:2: scheduled_time is before creation_time" in err


def test_philly_duplicate_job(tmp_path: Path) -> None:
    row = "vc1,7,ResNet-18,100,0,1,60\n"
    p = write(tmp_path, "philly.csv", PHILLY_HEAD + row + row)
    err = run_error("simulate", "--trace", f"philly:{p}", "--gpus", "8", "--json")
    assert "philly.csv:3: vc, job_seq: 'vc1-7' is also on line 2" in err


# -- options -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seeds", "needle"),
    [
        ("42-", "'42-' must be a seed (42) or a range"),
        ("42,42", "seed 42 is named twice"),
        ("40-45,44", "seed 44 is named twice"),
        ("1-100000000", "more than 1000 seeds"),
        ("51-42", "'51-42' runs backwards"),
        ("", "must be a seed"),
        ("-3", "must be a seed"),
    ],
)
def test_seeds_are_validated(tmp_path: Path, seeds: str, needle: str) -> None:
    n = write(tmp_path, "nodes.csv", NODES_CSV)
    p = write(tmp_path, "pods.csv", POD_HEAD + POD_OK)
    err = run_error("fill", "--nodes", str(n), "--pods", str(p), "--seeds", seeds, "--json")
    assert "--seeds: " in err and needle in err


def test_explain_past_the_horizon(tmp_path: Path) -> None:
    s = write(tmp_path, "s.yaml", SMALL)
    err = run_error("simulate", "--scenario", str(s), "--explain", "b-0@99h")
    assert "--explain: 99h is past the horizon (2h)" in err


def test_report_into_a_missing_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    s = write(tmp_path, "s.yaml", SMALL)
    err = run_error("simulate", "--scenario", str(s), "--report", str(tmp_path / "no" / "r.html"))
    assert f"--report: folder {tmp_path / 'no'} does not exist" in err


def test_report_says_where_it_wrote(tmp_path: Path) -> None:
    s = write(tmp_path, "s.yaml", SMALL)
    out = tmp_path / "r.html"
    result = invoke("simulate", "--scenario", str(s), "--report", str(out), "--json")
    assert result.exit_code == 0 and out.is_file()
    assert f"report written to {out.resolve()}" in result.stderr
    json.loads(result.stdout)  # stdout stays one JSON document


@pytest.mark.parametrize("port", ["99999", "0", "-1"])
def test_bad_port(tmp_path: Path, port: str) -> None:
    s = write(tmp_path, "s.yaml", SMALL)
    err = run_error("simulate", "--scenario", str(s), "--serve", "--port", port)
    assert f"--port: {port} is not a port number" in err


def test_busy_port_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    s = write(tmp_path, "s.yaml", SMALL)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = run_error("simulate", "--scenario", str(s), "--serve", "--port", str(port))
    assert f"--port: cannot listen on 127.0.0.1:{port}" in err


def test_run_with_a_missing_kubeconfig(tmp_path: Path) -> None:
    err = run_error("run", "--kubeconfig", str(tmp_path / "nope"))
    assert f"--kubeconfig: {tmp_path / 'nope'}: no such file" in err


def test_run_with_a_kubeconfig_without_current_context(tmp_path: Path) -> None:
    cfg = write(tmp_path, "kc", {"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": []})
    err = run_error("run", "--kubeconfig", str(cfg))
    assert "no current-context set" in err


def test_run_outside_a_pod_without_kubeconfig(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    err = run_error("run")
    assert "--kubeconfig: not given, and not running in a pod" in err


def test_workloads_export_needs_csv_or_json(tmp_path: Path) -> None:
    s = write(tmp_path, "s.yaml", SMALL)
    err = run_error("simulate", "--scenario", str(s), "--workloads", str(tmp_path / "w.xlsx"))
    assert "--workloads:" in err and ".csv or .json" in err


def test_profile_with_duplicate_keys(tmp_path: Path) -> None:
    prof = write(tmp_path, "p.yaml", "name: x\nname: y\nqueueSort: PrioritySort\n")
    s = write(tmp_path, "s.yaml", SMALL)
    err = run_error("simulate", "--scenario", str(s), "--profile", str(prof), "--json")
    assert "key 'name' is given twice" in err


def test_no_error_escapes_as_a_traceback_in_a_subprocess(tmp_path: Path) -> None:
    import subprocess
    import sys

    n = write(tmp_path, "nodes.csv", NODES_CSV + "n0,1,1,0,\n")
    p = write(tmp_path, "pods.csv", POD_HEAD + POD_OK)
    proc = subprocess.run(
        [sys.executable, "-m", "fairgpu.cli", "simulate", "--trace", f"openb:{p}", "--nodes", str(n)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "nodes.csv:4" in proc.stderr


def test_philly_without_gavels_throughputs_says_which_file_is_missing(tmp_path: Path) -> None:
    """A job with no V100 duration needs Gavel's throughput file beside the CSV, and the error says so."""
    row = "vc1,7,ResNet-18 (batch size 16),100,0,1,\n"
    p = write(tmp_path, "philly.csv", PHILLY_HEAD + row)
    err = run_error("simulate", "--trace", f"philly:{p}", "--gpus", "8", "--json")
    assert "philly.csv:2: iso_duration_s_v100: empty, and no simulation_throughputs.json.gz beside the trace" in err
    gavel = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "gavel-philly-vc"
    (tmp_path / "simulation_throughputs.json.gz").write_bytes((gavel / "simulation_throughputs.json.gz").read_bytes())
    assert invoke("simulate", "--trace", f"philly:{p}", "--gpus", "8", "--json").exit_code == 0


def test_a_run_over_no_time_is_an_error_not_a_crash() -> None:
    from fairgpu.catalog import load_profile
    from fairgpu.errors import ScenarioError
    from fairgpu.sim import scenario as scenario_mod
    from fairgpu.sim.runner import Simulation

    with pytest.raises(ScenarioError, match="horizon must be positive"):
        Simulation(scenario_mod.load("demo"), load_profile("fairgpu"), horizon=0.0)
