"""The operator's daily CLI (issue 16): version and -h, defaults in help, Go-style durations, validate,
scenarios show, per-workload export, started/never-started/preempted counts, a bounded trace horizon, the
idle-cluster warning, progress on a terminal, and a build without setuptools' license deprecation."""

from __future__ import annotations

import csv
import io
import json
import tomllib
from pathlib import Path

import pytest
from tests.test_cli import SMALL, assert_one_error_line, invoke, small_doc, write

from fairgpu.catalog import load_profile
from fairgpu.sim import progress
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim.runner import Simulation
from fairgpu.spec import format_duration, parse_duration

ROOT = Path(__file__).resolve().parents[1]


def test_version_and_short_help() -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.startswith("fairgpu 0.")
    for args in (["-h"], ["simulate", "-h"], ["fill", "-h"]):
        result = invoke(*args)
        assert result.exit_code == 0 and "Usage" in result.stdout, args


def _help(*args: str) -> str:
    return " ".join(invoke(*args, "-h").stdout.replace("│", " ").split())


def test_help_shows_defaults() -> None:
    out = _help("simulate")
    assert "default: (demo)" in out and "kube-default, fairgpu" in out and "14d for a trace" in out
    assert "default: 42-51" in _help("fill")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1h30m", 5400), ("2d12h", 216000), ("90s", 90), ("1.5h", 5400), ("500ms", 0.5), ("3600", 3600), (7, 7)],
)
def test_go_style_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1h30", "h", "1x", "-1h", "1h-30m", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds", [0, 59, 60, 3661, 5400, 86400 + 7200, 125 * 86400 + 13])
def test_format_duration_reads_back(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_horizon_accepts_1h30m(tmp_path: Path) -> None:
    result = invoke("simulate", "--scenario", str(write(tmp_path, "s.yaml", SMALL)), "--horizon", "1h30m", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["runs"][0]["horizon_s"] == 5400


def test_validate_scenario_and_profile(tmp_path: Path) -> None:
    result = invoke("validate", str(write(tmp_path, "s.yaml", SMALL)))
    assert result.exit_code == 0
    assert result.stdout == "ok: scenario small: 1 nodes (4 GPUs), 2 queues, 6 workloads over 2h\n"
    prof = write(tmp_path, "p.yaml", (ROOT / "src/fairgpu/profiles/kube-default.yaml").read_text())
    assert invoke("validate", str(prof)).stdout == "ok: profile kube-default\n"
    bad = small_doc()
    bad["workloads"][0]["prio"] = 1
    result = invoke("validate", str(write(tmp_path, "bad.yaml", bad)))
    assert result.exit_code == 2
    assert_one_error_line(result.stdout, result.stderr, "workloads[0].prio: unknown key")


def test_validate_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    result = invoke("validate", str(path))
    assert result.exit_code == 2 and "x.yaml: not a text file" in result.stderr


def test_scenarios_show_prints_a_template_that_validates(tmp_path: Path) -> None:
    result = invoke("scenarios", "show", "gang-starvation")
    assert result.exit_code == 0 and "name: gang-starvation" in result.stdout
    copy = write(tmp_path, "mine.yaml", result.stdout)
    assert invoke("validate", str(copy)).stdout.startswith("ok: scenario gang-starvation")
    assert "demo" in invoke("scenarios").stdout  # the listing still works
    result = invoke("scenarios", "show", "nope")
    assert result.exit_code == 2 and "no built-in scenario 'nope'" in result.stderr


def test_workloads_export_csv_and_json(tmp_path: Path) -> None:
    s = write(tmp_path, "s.yaml", SMALL)
    out = tmp_path / "w.csv"
    result = invoke("simulate", "--scenario", str(s), "--workloads", str(out), "--json")
    assert result.exit_code == 0 and f"workloads written to {out.resolve()}" in result.stderr
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 12  # 6 workloads x 2 profiles
    fair = {r["workload"]: r for r in rows if r["profile"] == "fairgpu"}
    # one node of 4 GPUs: a-0..a-3 start at once, the b's wait for an hour; the a's that fairgpu holds back
    # for b are submitted at t=0 too, so exactly two of the six wait
    assert sum(float(r["wait_s"]) > 0 for r in fair.values()) == 2
    assert all(r["state"] == "finished" for r in fair.values())
    out_json = tmp_path / "w.json"
    invoke("simulate", "--scenario", str(s), "--profile", "kube-default", "--workloads", str(out_json), "--json")
    doc = json.loads(out_json.read_text())["workloads"]
    assert {w["workload"] for w in doc} == {f"a-{i}" for i in range(4)} | {"b-0", "b-1"}
    assert {w["first_start_s"] for w in doc if w["workload"].startswith("b")} == {3600.0}


def test_table_has_started_never_started_preempted(tmp_path: Path) -> None:
    doc = small_doc()
    doc["horizon"] = "30m"  # the b's never start under kube-default within it
    result = invoke("simulate", "--scenario", str(write(tmp_path, "s.yaml", doc)), "--profile", "kube-default")
    out = result.stdout
    assert "started" in out and "never" in out and "preempted" in out
    line_b = next(x for x in out.splitlines() if x.strip("│ ").startswith("team-b"))
    cells = [c.strip() for c in line_b.split("│") if c.strip()]
    assert cells[-3:] == ["0/2", "2", "0"]


def test_never_started_in_json(tmp_path: Path) -> None:
    doc = small_doc()
    doc["horizon"] = "30m"
    path = write(tmp_path, "s.yaml", doc)
    result = invoke("simulate", "--scenario", str(path), "--profile", "kube-default", "--json")
    queues = json.loads(result.stdout)["queues"]
    assert (queues["team-a"]["never_started"], queues["team-b"]["never_started"]) == (0, 2)


def test_trace_replays_a_bounded_window_and_says_so(tmp_path: Path) -> None:
    head = "vc,job_seq,job_type,total_steps,arrival_time_s,num_gpus,iso_duration_s_v100\n"
    rows = "".join(f"vc{i % 2},{i},ResNet-18,100,{i * 86400 * 10},1,3600\n" for i in range(10))  # 90 days
    p = write(tmp_path, "philly.csv", head + rows)
    result = invoke("simulate", "--trace", f"philly:{p}", "--gpus", "8", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["runs"][0]["horizon_s"] == 14 * 86400
    assert "spans 90d; replaying its first 14d (--horizon 90d replays all of it" in result.stderr


def test_idle_cluster_warning_points_at_fill(tmp_path: Path) -> None:
    nodes = write(tmp_path, "n.csv", "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"n{i},32000,262144,8,T4\n" for i in range(10)))  # fmt: skip
    head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time\n"
    pods = write(tmp_path, "p.csv", head + "p0,1000,1024,1,1000,,LS,0,600\np1,1000,1024,1,1000,,LS,86000,86400\n")
    result = invoke("simulate", "--trace", f"openb:{pods}", "--nodes", str(nodes), "--profile", "fairgpu", "--json")
    assert result.exit_code == 0, result.output
    assert "GPUs were 0.0% busy over 1d" in result.stderr and "fairgpu fill" in result.stderr


def test_busy_cluster_gets_no_warning(tmp_path: Path) -> None:
    result = invoke("simulate", "--scenario", str(write(tmp_path, "s.yaml", SMALL)), "--json")
    assert "warning" not in result.stderr


def test_replay_progress_on_a_terminal_gives_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    buf = io.StringIO()
    monkeypatch.setattr(progress, "_console", lambda: Console(file=buf, force_terminal=True, width=100))
    sc = scenario_mod.load("gang-starvation")
    shown = progress.replay_with_progress(Simulation(sc, load_profile("fairgpu")))
    plain = Simulation(sc, load_profile("fairgpu")).run()
    assert "replaying" in buf.getvalue() and "100%" in buf.getvalue()
    assert shown.to_json() == plain.to_json()
    with progress.status("loading trace"):
        pass
    assert "loading trace" in buf.getvalue()


def test_license_is_an_spdx_string() -> None:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert doc["project"]["license"] == "Apache-2.0"
    assert any(req.startswith("setuptools>=77") for req in doc["build-system"]["requires"])
