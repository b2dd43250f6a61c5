"""The trace format (twin/): what the recorder writes replays to the very same run; bad lines are one-line
errors naming line and field; files rotate and each replays on its own; `simulate --trace fairgpu:FILE`
puts the recorded run beside the replays, with other queues too."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fairgpu.catalog import load_profile
from fairgpu.cli import app
from fairgpu.errors import ScenarioError
from fairgpu.model import QueueSpec
from fairgpu.model.queue import NEVER, PreemptionPolicy
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim.recorded import read_fairgpu
from fairgpu.sim.runner import Simulation
from fairgpu.spec import QueueDoc
from fairgpu.twin.encode import queue_doc
from fairgpu.twin.recorder import EngineRecorder, Recorder
from fairgpu.twin.writer import MIN_BYTES, TraceWriter
from test_twin_parity import scenario as parity_scenario

runner = CliRunner()


def record(sc, path: Path, max_bytes: int = 100 << 20, keep: int = 3):
    """Simulate `sc` with the recorder attached, as `fairgpu run --record` attaches it to the controller."""
    writer = TraceWriter(path, max_bytes, keep)
    sim = Simulation(sc, load_profile("fairgpu"))
    sim.observer = EngineRecorder(Recorder(writer, "simulate", profile="fairgpu"))
    sim.run()
    writer.close()
    return writer


@pytest.mark.parametrize("name", ["elastic", "parity"])
def test_a_recorded_run_replays_to_the_same_run(tmp_path, name):
    """Gangs, reclaim and elastic shrinking: every workload starts when it started, is evicted as often."""
    sc = parity_scenario() if name == "parity" else scenario_mod.load(name)
    sc.recreated = True  # as on a cluster, and so as a trace replays: evicted pods come back as new ones
    res = Simulation(sc, load_profile("fairgpu")).run()
    record(sc, tmp_path / "t.jsonl")
    trace = read_fairgpu(tmp_path / "t.jsonl")
    again = Simulation(trace.scenario, load_profile("fairgpu"), horizon=res.horizon_s).run()
    assert res.evictions > 0
    rows = {w["workload"]: (w["first_start_s"], w["evictions"], w["state"]) for w in res.workloads}
    assert {w["workload"]: (w["first_start_s"], w["evictions"], w["state"]) for w in again.workloads} == rows
    for q, v in res.queues.items():
        assert again.queues[q]["gpu_hours"] == pytest.approx(v["gpu_hours"], rel=1e-9)


QUEUE_SPECS = [
    QueueSpec("root", 2.5),
    QueueSpec("a", 1.0, np.array([4.0, np.inf, np.inf, np.inf]), np.array([8.0, np.inf, 64000.0, np.inf]), "root"),
    QueueSpec("b", lendable=np.array([1.0, np.inf, np.inf, np.inf]), guaranteed=np.array([2.0, 0, 0, 0])),
    QueueSpec("c", allocation="static", preemption=NEVER, usage_half_life=3600, fair_within="users"),
    QueueSpec("d", preemption=PreemptionPolicy(fair_share=True, within_queue="LowerPriority", grace_period=30)),
    QueueSpec("e", preemption=PreemptionPolicy(fair_share=True, fair_share_max_runtime=1800)),
]


@pytest.mark.parametrize("spec", QUEUE_SPECS, ids=lambda q: q.name)
def test_queues_are_recorded_in_the_queue_schema_and_read_back_equal(spec):
    back = QueueDoc.model_validate(queue_doc(spec)).to_spec()
    assert queue_doc(back) == queue_doc(spec)
    for f in ("guaranteed", "limit"):
        assert np.array_equal(getattr(back, f), getattr(spec, f))
    assert back.preemption == spec.preemption
    assert (back.lendable is None) == (spec.lendable is None)
    if spec.lendable is not None:
        assert np.array_equal(back.lendable, spec.lendable)


@pytest.fixture
def trace(tmp_path) -> Path:
    record(parity_scenario(), tmp_path / "t.jsonl")
    return tmp_path / "t.jsonl"


def _edit(path: Path, line: int, change) -> Path:
    lines = path.read_text().splitlines()
    lines[line - 1] = change(lines[line - 1])
    path.write_text("\n".join(lines) + "\n")
    return path


SECOND_HEADER = {"kind": "header", "schema": "fairgpu-trace", "version": 1, "epoch": 0.0, "source": "run"}


def _set(key: str, value: object):
    return lambda text: json.dumps({**json.loads(text), key: value})


@pytest.mark.parametrize(
    ("line", "change", "message"),
    [
        (1, _set("version", 3), ":1: version: 3; this fairgpu reads versions 1 and 2"),
        (2, _set("t", "soon"), ":2: t: Input should be a valid number"),
        (4, lambda text: text[:-5], ":4: not JSON"),
        (4, _set("kind", "launch"), ":4: kind: 'launch' is not one of header, nodes"),
        (4, _set("pods", []), ":4: pods: List should have at least 1 item"),
        (4, _set("queue", "team-z"), ":4: queue: 'team-z' is not in the trace's queues"),
        (4, _set("colour", "red"), ":4: colour: unknown key"),
        (5, _set("t", -5.0), ":5: t: -5 is before the line above's 0"),
        (2, lambda _: json.dumps(SECOND_HEADER), ":2: kind: a second header"),
    ],
)
def test_a_bad_record_is_one_line_naming_line_and_field(trace, line, change, message):
    _edit(trace, line, change)
    result = runner.invoke(app, ["simulate", "--trace", f"fairgpu:{trace}"])
    assert result.exit_code == 2, result.output
    err = " ".join(result.output.split())
    assert message in err and err.count("error:") == 1


def test_a_start_of_a_workload_never_submitted_is_refused(trace):
    lines = trace.read_text().splitlines()
    start = next(i for i, t in enumerate(lines) if '"kind":"start"' in t)
    lines[start] = json.dumps({**json.loads(lines[start]), "workload": "x/ghost"})
    trace.write_text("\n".join(lines) + "\n")
    with pytest.raises(ScenarioError, match=rf":{start + 1}: workload: 'x/ghost' starts but was never submitted"):
        read_fairgpu(trace)


def test_the_trace_rotates_and_every_file_replays_on_its_own(tmp_path):
    sc = scenario_mod.load("fair-share-preemption")  # 700 workloads: several files of 64 KiB
    path = tmp_path / "t.jsonl"
    path.write_text("an earlier run's trace\n")
    writer = record(sc, path, max_bytes=MIN_BYTES, keep=2)
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == ["t.jsonl", "t.jsonl.1", "t.jsonl.2"]  # the oldest dropped past `keep`
    assert 2 < writer.rotations < sum(len(f.read_bytes()) for f in files) // MIN_BYTES + 3  # not at every cycle
    for f in files:
        trace = read_fairgpu(f)
        assert trace.scenario.nodes == sc.nodes and trace.scenario.workloads
        running_at_start = [r for r in trace.runs if r.start == 0.0]
        assert f.name == "t.jsonl.2" or running_at_start  # a rotated file opens with what was running


def test_the_trace_refuses_a_size_that_would_rotate_at_every_cycle(tmp_path):
    with pytest.raises(ScenarioError.__mro__[1], match="--record-max-mb"):
        TraceWriter(tmp_path / "t.jsonl", max_bytes=1000)
    with pytest.raises(ScenarioError.__mro__[1], match="folder"):
        TraceWriter(tmp_path / "nope" / "t.jsonl")


def test_replay_with_another_weight_shows_what_changes(trace, tmp_path):
    """The recorded run, the replay (the same figures) and the what-if with team-b weighing 3 instead of 1."""
    queues = tmp_path / "queues.yaml"
    queues.write_text(
        yaml.safe_dump(
            {
                "queues": [
                    {"name": "team-a", "weight": 3},
                    {"name": "team-b", "weight": 3},
                    {"name": "team-c", "guaranteed": {"nvidia.com/gpu": 8}},
                ]
            }
        )
    )
    result = runner.invoke(app, ["simulate", "--trace", f"fairgpu:{trace}", "--queues", str(queues), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    recorded, replay, what_if = doc["columns"]
    assert [c["label"] for c in doc["columns"]] == ["recorded", "replay (fairgpu)", "what-if (fairgpu, queues.yaml)"]
    for q in recorded["queues"]:
        assert replay["queues"][q]["gpu_hours"] == pytest.approx(recorded["queues"][q]["gpu_hours"], rel=1e-6)
    assert recorded["evictions"] == replay["evictions"] == 4
    # b weighs as much as a now: at 40 min its requeued jobs start before a's waiting ones
    assert what_if["queues"]["team-b"]["wait_p95_s"] < replay["queues"]["team-b"]["wait_p95_s"]
    report = tmp_path / "r.html"
    result = runner.invoke(
        app, ["simulate", "--trace", f"fairgpu:{trace}", "--queues", str(queues), "--report", str(report)]
    )
    assert result.exit_code == 0 and "what-if (fairgpu, queues.yaml)" in report.read_text()
    assert "recorded" in result.stdout and "what-if" in result.stdout


def test_queues_that_lose_a_queue_of_the_trace_are_refused(trace, tmp_path):
    queues = tmp_path / "q.yaml"
    queues.write_text(yaml.safe_dump([{"name": "team-a"}, {"name": "team-b"}]))
    result = runner.invoke(app, ["simulate", "--trace", f"fairgpu:{trace}", "--queues", str(queues)])
    assert result.exit_code == 2
    assert "queue 'team-c' (2 workloads in the trace) is missing" in " ".join(result.output.split())
    queues.write_text(yaml.safe_dump([{"name": "team-a", "weight": -1}]))
    result = runner.invoke(app, ["simulate", "--trace", f"fairgpu:{trace}", "--queues", str(queues)])
    assert result.exit_code == 2 and "queues[0].weight" in result.output


def test_queue_resources_as_kubectl_prints_them_are_accepted(trace, tmp_path):
    items = [{"apiVersion": "fairgpu.io/v1alpha1", "kind": "Queue", "metadata": {"name": f"team-{t}"},
              "spec": {"namespaces": [t], "weight": 2 if t == "a" else 1}} for t in "abc"]  # fmt: skip
    queues = tmp_path / "q.yaml"
    queues.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    result = runner.invoke(app, ["simulate", "--trace", f"fairgpu:{trace}", "--queues", str(queues), "--json"])
    assert result.exit_code == 0, result.output


def test_record_refuses_a_bad_destination_before_connecting(tmp_path):
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:9"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
                "users": [{"name": "u", "user": {}}],
            }
        )
    )
    result = runner.invoke(app, ["record", str(tmp_path / "nope" / "t.jsonl"), "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 2 and "OUT: folder" in result.output


ROOT = Path(__file__).resolve().parents[1]


def test_the_worked_example_in_the_docs_runs_and_prints_its_table(monkeypatch):
    """docs/twin.md's worked example: its command, run from the repository root on the trace and queues
    docs/examples/ ships, prints the very table the page shows (so the figures it reads out are current).
    When an engine change moves them: `pytest tests/test_twin_parity.py --basetemp=DIR`, copy
    DIR/test_live_simulated_and_replay0/trace.jsonl to docs/examples/twin-trace.jsonl, paste the new table
    and reread it."""
    text = (ROOT / "docs/twin.md").read_text()
    section = text[text.index("## Worked example") : text.index("## Parity")]
    command, table = re.search(r"```sh\n(.*?)```\n\n```\n(.*?)```", section, re.S).groups()
    monkeypatch.chdir(ROOT)
    result = runner.invoke(app, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
    printed = [line.rstrip() for line in result.stdout.splitlines()]
    shown = table.strip().splitlines()
    assert len(shown) > 10 and printed[-len(shown) :] == shown
