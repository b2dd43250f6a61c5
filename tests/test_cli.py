"""The `fairgpu` command: bad input is one error line on stderr with exit status 2; --json output is one
JSON document on stdout with the documented keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fairgpu.cli import app

TOP_KEYS = {"scenario", "profile", "horizon_s", "utilization", "fairness_error", "jain_index", "queues"}
QUEUE_KEYS = {
    "gpu_hours",
    "entitled_gpu_hours",
    "mean_share",
    "mean_entitled",
    "wait_p50_s",
    "wait_p95_s",
    "wait_max_s",
    "completed",
    "preempted",
}

# One 4-GPU node; team-a asks for all four GPUs for an hour at t=0, team-b for two, just after.
SMALL = """\
name: small
horizon: 2h
cluster:
  nodes:
    - {count: 1, name: n, gpus: 4, gpu_model: A100-80GB, gpu_memory: 80Gi, cpu: 32, memory: 256Gi}
queues:
  - {name: team-a}
  - {name: team-b}
workloads:
  - {queue: team-a, name: a, count: 4, duration: 1h, requests: {nvidia.com/gpu: 1, cpu: "1", memory: 1Gi}}
  - {queue: team-b, name: b, count: 2, duration: 1h, requests: {nvidia.com/gpu: 1, cpu: "1", memory: 1Gi}}
"""


def small_doc() -> dict:
    return yaml.safe_load(SMALL)


runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def write(tmp_path: Path, name: str, doc: dict | str) -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def _bad_docs() -> list[tuple[str, dict | str, str]]:
    """(file id, content, text the error line must contain)."""
    unknown_key = small_doc()
    unknown_key["workloads"][0]["prio"] = 1
    negative = small_doc()
    negative["workloads"][1]["count"] = -3
    unknown_queue = small_doc()
    unknown_queue["workloads"][1]["queue"] = "team-z"
    quantity = small_doc()
    quantity["cluster"]["nodes"][0]["cpu"] = "lots"
    too_big = small_doc()
    too_big["workloads"][0]["requests"]["nvidia.com/gpu"] = 9
    bad_duration = small_doc()
    bad_duration["workloads"][0]["duration"] = "3 weeks"
    return [
        ("unknown-key", unknown_key, "workloads[0].prio: unknown key"),
        ("negative-count", negative, "workloads[1].count:"),
        ("unknown-queue", unknown_queue, "workloads[1].queue: 'team-z' is not a queue"),
        ("bad-quantity", quantity, "cluster.nodes[0].cpu: 'lots'"),
        ("too-big-gpu", too_big, "workloads[0].requests: nvidia.com/gpu 9 is more than any node has"),
        ("bad-duration", bad_duration, "workloads[0].duration: '3 weeks' is not a duration"),
        ("not-yaml", "name: [unclosed\n  horizon: : 1h\n", "not valid YAML at line"),
        ("list-yaml", "- 1\n- 2\n", "expected a mapping"),
    ]


BAD_DOCS = _bad_docs()


def assert_one_error_line(stdout: str, stderr: str, *needles: str) -> None:
    assert stdout == ""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    for needle in needles:
        assert needle in lines[0], stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(("content", "needle"), [b[1:] for b in BAD_DOCS], ids=[b[0] for b in BAD_DOCS])
def test_bad_scenario_file_is_one_error_line_exit_2(tmp_path: Path, content: dict | str, needle: str) -> None:
    path = write(tmp_path, "bad.yaml", content)
    result = invoke("simulate", "--scenario", str(path), "--json")
    assert result.exit_code == 2
    assert_one_error_line(result.stdout, result.stderr, needle)


def test_missing_scenario_file(tmp_path: Path) -> None:
    result = invoke("simulate", "--scenario", str(tmp_path / "nope.yaml"), "--json")
    assert result.exit_code == 2
    assert_one_error_line(result.stdout, result.stderr, "no such file or built-in scenario")


@pytest.mark.parametrize("queue", ["team[b]", "ml[/ops]"])
def test_error_text_from_the_file_is_printed_verbatim(tmp_path: Path, queue: str) -> None:
    # User text in brackets must not be taken for terminal markup (dropped, or crashing the CLI).
    doc = small_doc()
    doc["workloads"][1]["queue"] = queue
    result = invoke("simulate", "--scenario", str(write(tmp_path, "s.yaml", doc)), "--json")
    assert result.exit_code == 2
    assert_one_error_line(result.stdout, result.stderr, f"workloads[1].queue: {queue!r} is not a queue")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--profile", "no-such-profile"], ("no-such-profile",)),
        (["--horizon", "0"], ("--horizon", "must be positive")),
        (["--horizon", "3 weeks"], ("--horizon", "'3 weeks' is not a duration")),
        (["--nodes", "x.csv"], ("--nodes and --gpus go with --trace",)),
        (["--trace", "slurm:x.csv"], ("--trace", "'slurm:x.csv'")),
    ],
    ids=["unknown-profile", "zero-horizon", "bad-horizon", "nodes-without-trace", "bad-trace-kind"],
)
def test_bad_options_are_one_error_line(tmp_path: Path, args: list[str], needles: tuple[str, ...]) -> None:
    scenario = [] if "--trace" in args else ["--scenario", str(write(tmp_path, "s.yaml", SMALL))]
    result = invoke("simulate", *scenario, *args, "--json")
    assert result.exit_code == 2
    assert_one_error_line(result.stdout, result.stderr, *needles)


def test_scenarios_lists_builtins() -> None:
    result = invoke("scenarios")
    assert result.exit_code == 0
    for name in ("demo", "priority-monopoly", "batch-monopoly"):
        assert name in result.stdout


def test_profiles_lists_builtins() -> None:
    result = invoke("profiles")
    assert result.exit_code == 0
    for name in ("kube-default", "fairgpu"):
        assert name in result.stdout


@pytest.fixture(scope="module")
def small_json(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    path = tmp_path_factory.mktemp("cli") / "small.yaml"
    path.write_text(SMALL)
    out = {}
    for profile in ("kube-default", "fairgpu"):
        result = invoke("simulate", "--scenario", str(path), "--profile", profile, "--json")
        assert result.exit_code == 0, result.stderr
        assert result.stderr == ""
        assert result.stdout.endswith("\n")
        assert result.stdout.count("\n") == 1  # exactly one document, one line
        out[profile] = json.loads(result.stdout)
    return out


@pytest.mark.parametrize("profile", ["kube-default", "fairgpu"])
def test_simulate_json_has_documented_keys(small_json: dict[str, dict], profile: str) -> None:
    doc = small_json[profile]
    assert set(doc) >= TOP_KEYS
    assert doc["scenario"] == "small"
    assert doc["profile"] == profile
    assert doc["horizon_s"] == 7200
    assert set(doc["queues"]) == {"team-a", "team-b"}
    for name, q in doc["queues"].items():
        assert set(q) >= QUEUE_KEYS, name


def test_simulate_json_values_kube_default(small_json: dict[str, dict]) -> None:
    # FIFO: team-a's four jobs take the node for the first hour; team-b waits an hour, then runs.
    doc = small_json["kube-default"]
    a, b = doc["queues"]["team-a"], doc["queues"]["team-b"]
    assert doc["utilization"] == pytest.approx(6 / 8)
    assert a["gpu_hours"] == pytest.approx(4)
    assert b["gpu_hours"] == pytest.approx(2)
    assert a["wait_max_s"] == pytest.approx(0)
    assert b["wait_p50_s"] == pytest.approx(3600)
    assert b["wait_max_s"] == pytest.approx(3600)
    assert (a["completed"], b["completed"]) == (4, 2)
    assert (a["preempted"], b["preempted"]) == (0, 0)
    # First hour: a holds 1.0 against 0.5 entitled, b 0 against 0.5 → error 0.5; second hour fair.
    assert doc["fairness_error"] == pytest.approx(0.25)
    assert a["mean_share"] == pytest.approx(0.5)
    assert a["mean_entitled"] == pytest.approx(0.25)


def test_simulate_json_values_fairgpu(small_json: dict[str, dict]) -> None:
    # Fair share: two GPUs each in the first hour, team-a's other two in the second.
    doc = small_json["fairgpu"]
    a, b = doc["queues"]["team-a"], doc["queues"]["team-b"]
    assert doc["utilization"] == pytest.approx(6 / 8)
    assert doc["fairness_error"] == pytest.approx(0)
    # team-b never waits, so no two queues are ever backlogged together: Jain's index is undefined.
    assert doc["jain_index"] is None and doc["jain_window_s"] == 0
    assert b["wait_max_s"] == pytest.approx(0)
    assert a["wait_max_s"] == pytest.approx(3600)
    assert a["gpu_hours"] == pytest.approx(4)
    assert b["gpu_hours"] == pytest.approx(2)


# org holds team-a and team-b; solo never submits. Only team-a ever waits (six jobs on four GPUs).
HIERARCHY = """\
name: hier
horizon: 2h
cluster:
  nodes:
    - {count: 1, name: n, gpus: 4, gpu_model: A100-80GB, gpu_memory: 80Gi, cpu: 32, memory: 256Gi}
queues:
  - {name: org}
  - {name: team-a, parent: org}
  - {name: team-b, parent: org}
  - {name: solo}
workloads:
  - {queue: team-a, name: a, count: 6, duration: 1h, requests: {nvidia.com/gpu: 1, cpu: "1", memory: 1Gi}}
  - {queue: team-b, name: b, count: 1, duration: 1h, requests: {nvidia.com/gpu: 1, cpu: "1", memory: 1Gi}}
"""


@pytest.fixture(scope="module")
def hierarchy_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = tmp_path_factory.mktemp("cli") / "hier.yaml"
    path.write_text(HIERARCHY)
    result = invoke("simulate", "--scenario", str(path), "--profile", "fairgpu", "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_inner_queues_report_their_subtree(hierarchy_json: dict) -> None:
    queues = hierarchy_json["queues"]
    assert set(queues) == {"org", "team-a", "team-b", "solo"}
    assert queues["team-a"]["parent"] == "org"
    assert queues["org"]["parent"] is None
    org, a, b = queues["org"], queues["team-a"], queues["team-b"]
    for key in ("gpu_hours", "submitted", "started", "completed"):
        assert org[key] == pytest.approx(a[key] + b[key]), key
    assert org["gpu_hours"] == pytest.approx(7)
    assert org["wait_max_s"] == pytest.approx(3600)
    assert org["backlogged_s"] == pytest.approx(a["backlogged_s"]) == pytest.approx(3600)
    assert queues["solo"]["submitted"] == 0
    assert queues["solo"]["wait_max_s"] is None


def test_inner_queue_own_children_are_not_others(hierarchy_json: dict) -> None:
    # Only org's own child team-a ever waits: no queue outside org does, so org's share "while others
    # wait" is undefined, as it is for team-a (whose only waiting peer would be itself).
    queues = hierarchy_json["queues"]
    assert queues["team-a"]["share_while_others_wait"] is None
    assert queues["team-b"]["share_while_others_wait"] == pytest.approx(0.25)
    assert queues["org"]["share_while_others_wait"] is None


def test_simulate_json_with_two_profiles_is_one_document_of_runs(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", SMALL)
    result = invoke(
        "simulate",
        "--scenario",
        str(path),
        "--profile",
        "kube-default",
        "--profile",
        "fairgpu",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("\n") == 1
    doc = json.loads(result.stdout)
    assert [run["profile"] for run in doc["runs"]] == ["kube-default", "fairgpu"]


def test_simulate_horizon_override(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", SMALL)
    result = invoke("simulate", "--scenario", str(path), "--profile", "fairgpu", "--horizon", "30m", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["horizon_s"] == 1800
    assert doc["queues"]["team-a"]["completed"] == 0  # nothing of an hour finishes in 30 minutes


def test_simulate_table_output(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", SMALL)
    result = invoke("simulate", "--scenario", str(path))
    assert result.exit_code == 0, result.stderr
    for text in ("small", "kube-default", "fairgpu", "team-a", "team-b", "75.0%"):
        assert text in result.stdout


# -- the installed command, in a real process ------------------------------------------------------------


def fairgpu_cmd() -> list[str]:
    script = Path(sys.executable).with_name("fairgpu")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "fairgpu.cli"]


def run_process(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env["COLUMNS"] = "40"  # a narrow terminal must not wrap the error line
    return subprocess.run(
        [*fairgpu_cmd(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_process_bad_scenario_exit_status_and_streams(tmp_path: Path) -> None:
    doc = small_doc()
    doc["workloads"][1]["queue"] = "team-z"
    proc = run_process("simulate", "--scenario", str(write(tmp_path, "bad.yaml", doc)), "--json")
    assert proc.returncode == 2
    assert_one_error_line(proc.stdout, proc.stderr, "workloads[1].queue: 'team-z' is not a queue (known:")


def test_process_json_on_stdout_only(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", SMALL)
    proc = run_process("simulate", "--scenario", str(path), "--profile", "fairgpu", "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.count("\n") == 1
    doc = json.loads(proc.stdout)
    assert set(doc) >= TOP_KEYS
    assert doc["profile"] == "fairgpu"
