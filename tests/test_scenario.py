"""Scenario validation: every bad input is one ScenarioError line naming the field; good input expands as
documented (node names, count/every/at, pods → gang, seeded durations, HAMi units)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairgpu.errors import ScenarioError
from fairgpu.sim.scenario import build, builtin_scenarios, load, parse_duration


def base() -> dict[str, Any]:
    """A small valid scenario: two 8-GPU nodes (80 GiB GPUs), two queues, one workload group."""
    return {
        "name": "t",
        "horizon": "1h",
        "cluster": {
            "nodes": [
                {
                    "count": 2,
                    "name": "a100",
                    "gpus": 8,
                    "gpu_model": "A100-80GB",
                    "gpu_memory": "80Gi",
                    "cpu": 64,
                    "memory": "512Gi",
                }
            ]
        },
        "queues": [{"name": "team-a"}, {"name": "team-b"}],
        "workloads": [
            {
                "queue": "team-a",
                "count": 3,
                "every": "10s",
                "duration": "5m",
                "requests": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"},
            }
        ],
    }


def node0(d: dict[str, Any]) -> dict[str, Any]:
    return d["cluster"]["nodes"][0]


def wl0(d: dict[str, Any]) -> dict[str, Any]:
    return d["workloads"][0]


def set_request(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: wl0(d)["requests"].__setitem__(key, value)


# (id, mutation of base(), text the message must contain: the field path, then the problem)
BAD: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("unknown top-level key", lambda d: d.update(bogus=1), "bogus", "unknown key"),
    ("unknown node key", lambda d: node0(d).update(gpuz=4), "cluster.nodes[0].gpuz", "unknown key"),
    ("unknown workload key", lambda d: wl0(d).update(prio=5), "workloads[0].prio", "unknown key"),
    ("unknown queue key", lambda d: d["queues"][1].update(wieght=2), "queues[1].wieght", "unknown key"),
    ("negative node count", lambda d: node0(d).update(count=-1), "cluster.nodes[0].count", "greater than"),
    ("negative workload count", lambda d: wl0(d).update(count=-2), "workloads[0].count", "greater than"),
    ("negative gpus", lambda d: node0(d).update(gpus=-1), "cluster.nodes[0].gpus", "greater than"),
    ("zero pods", lambda d: wl0(d).update(pods=0), "workloads[0].pods", "greater than"),
    ("zero weight", lambda d: d["queues"][0].update(weight=0), "queues[0].weight", "greater than"),
    (
        "gpu count larger than any node",
        set_request("nvidia.com/gpu", 9),
        "workloads[0].requests",
        "nvidia.com/gpu 9 is more than any node has",
    ),
    (
        "gpumem larger than any GPU",
        set_request("nvidia.com/gpumem", 102400),
        "workloads[0].requests",
        "nvidia.com/gpumem 102400 MiB each is more than any node has",
    ),
    (
        "cpu larger than any node",
        set_request("cpu", "65"),
        "workloads[0].requests",
        "cpu request 65000m is more than any node has",
    ),
    (
        "gpumem with a unit (HAMi reads the plain number as MiB and drops a value beyond int32)",
        set_request("nvidia.com/gpumem", "10Gi"),
        "workloads[0].requests.nvidia.com/gpumem",
        "plain integer number of MiB",
    ),
    (
        "unknown resource",
        set_request("nvidia.com/gpus", 1),
        "workloads[0].requests",
        "unknown resource 'nvidia.com/gpus'",
    ),
    (
        "unknown queue",
        lambda d: wl0(d).update(queue="team-z"),
        "workloads[0].queue",
        "'team-z' is not a queue",
    ),
    (
        "workload in a parent queue",
        lambda d: d["queues"][1].update(parent="team-a"),
        "workloads[0].queue",
        "has child queues",
    ),
    (
        "bad fair_within",
        lambda d: d["queues"][0].update(fair_within="lottery"),
        "queues[0].fair_within",
        "'fifo' or 'users'",
    ),
    (
        "bad usage_half_life",
        lambda d: d["queues"][0].update(usage_half_life="soon"),
        "queues[0].usage_half_life",
        "not a duration",
    ),
    (
        "bad starvation_after",
        lambda d: d["queues"][0].update(starvation_after="-1m"),
        "queues[0].starvation_after",
        "not a duration",
    ),
    ("parent not a queue", lambda d: d["queues"][1].update(parent="nope"), "queues[1].parent", "not a queue"),
    ("duplicate queue", lambda d: d["queues"][1].update(name="team-a"), "queues[", "used twice"),
    ("unparsable node cpu", lambda d: node0(d).update(cpu="lots"), "cluster.nodes[0].cpu", "'lots'"),
    ("unparsable node memory", lambda d: node0(d).update(memory="12Qi"), "cluster.nodes[0].memory", "'12Qi'"),
    ("unparsable request cpu", set_request("cpu", "lots"), "workloads[0].requests.cpu", "'lots'"),
    ("unparsable request memory", set_request("memory", "12Qi"), "workloads[0].requests.memory", "'12Qi'"),
    ("negative request cpu", set_request("cpu", "-1"), "workloads[0].requests.cpu", "negative"),
    (
        "unparsable guarantee",
        lambda d: d["queues"][0].update(guaranteed={"cpu": "lots"}),
        "queues[0].guaranteed",
        "'lots'",
    ),
    ("bad duration", lambda d: wl0(d).update(duration="3 weeks"), "workloads[0].duration", "not a duration"),
    ("bad every", lambda d: wl0(d).update(every="3 weeks"), "workloads[0].every", "not a duration"),
    (
        "bad min_runtime",
        lambda d: d["queues"][0].update(preemption={"min_runtime": "soon"}),
        "queues[0].preemption.min_runtime",
        "not a duration",
    ),
    ("bad preemption", lambda d: d["queues"][0].update(preemption="sometimes"), "queues[0].preemption:", "'never'"),
    (
        "bad fair-share bound",
        lambda d: d["queues"][0].update(preemption={"fair_share_max_runtime": "soon"}),
        "queues[0].preemption.fair_share_max_runtime",
        "not a duration",
    ),
    ("bad horizon", lambda d: d.update(horizon="3 weeks"), "horizon", "not a duration"),
    ("zero horizon", lambda d: d.update(horizon=0), "horizon", "must be positive"),
    (
        "missing duration",
        lambda d: wl0(d).pop("duration"),
        "workloads[0].duration",
        "required key is missing",
    ),
    ("missing name", lambda d: d.pop("name"), "name", "required key is missing"),
    ("missing node cpu", lambda d: node0(d).pop("cpu"), "cluster.nodes[0].cpu", "required key is missing"),
    ("missing queue", lambda d: wl0(d).pop("queue"), "workloads[0].queue", "required key is missing"),
    ("missing queues", lambda d: d.pop("queues"), "queues", "required key is missing"),
    (
        "duration_max below duration",
        lambda d: wl0(d).update(duration_max="1m"),
        "workloads[0]",
        "duration_max must not be less than duration",
    ),
    (
        "gpu node without a model",
        lambda d: node0(d).pop("gpu_model"),
        "cluster.nodes[0]",
        "gpu_model",
    ),
    (
        "colliding node names",
        lambda d: d["cluster"]["nodes"].append(dict(node0(d))),
        "cluster.nodes",
        "collide",
    ),
    ("gpu_numa not one per GPU", lambda d: node0(d).update(gpu_numa=[0, 1]), "cluster.nodes[0]", "gpu_numa: 2 entries"),
    ("negative NUMA node", lambda d: node0(d).update(gpu_numa=[-1] * 8), "cluster.nodes[0].gpu_numa", "negative"),
    ("mig mode without profiles", lambda d: node0(d).update(gpu_mode="mig"), "cluster.nodes[0]", "mig_profiles"),
    ("unknown GPU mode", lambda d: node0(d).update(gpu_mode="vgpu"), "cluster.nodes[0].gpu_mode", "'hami-core'"),
    (
        "MIG profiles without mig mode",
        lambda d: node0(d).update(mig_profiles=[MIG_1G]),
        "cluster.nodes[0]",
        "mig_profiles: needed with gpu_mode mig",
    ),
    (
        "MIG profile memory without a unit",
        lambda d: node0(d).update(gpu_mode="mig", mig_profiles=[{**MIG_1G, "memory": 5120}]),
        "cluster.nodes[0].mig_profiles[0].memory",
        "unit",
    ),
    (
        "MIG profile without placements",
        lambda d: node0(d).update(gpu_mode="mig", mig_profiles=[{**MIG_1G, "placements": []}]),
        "cluster.nodes[0].mig_profiles[0].placements",
        "at least 1",
    ),
    (
        "MIG profile larger than the GPU",
        lambda d: node0(d).update(gpu_mode="mig", mig_profiles=[{**MIG_1G, "memory": "90Gi"}]),
        "cluster.nodes[0]",
        "mig_profiles: 1g.5gb has more memory than the GPU",
    ),
    (
        "pair_scores not GPU x GPU",
        lambda d: node0(d).update(pair_scores=[[0, 1]] * 8),
        "cluster.nodes[0]",
        "pair_scores: 8 rows of 8 scores",
    ),
    (
        "bad scoring weights",
        lambda d: wl0(d).update(device_scoring_weights="slot=1,core=1"),
        "workloads[0].device_scoring_weights",
        "expected slot, core, and memory weights",
    ),
    (
        "unknown GPU policy in a chain",
        lambda d: wl0(d).update(gpu_scheduler_policy="binpack,fastest"),
        "workloads[0].gpu_scheduler_policy",
        "'fastest' is not one of",
    ),
]
MIG_1G = {"name": "1g.5gb", "memory": "5Gi", "cores": 14, "slices": 1, "placements": [{"start": 0, "size": 1}]}


@pytest.mark.parametrize(("mutate", "path", "problem"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_naming_field_and_problem(
    mutate: Callable[[dict[str, Any]], None], path: str, problem: str
) -> None:
    doc = base()
    mutate(doc)
    with pytest.raises(ScenarioError) as info:
        build(doc)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert msg.startswith(path), f"{msg!r} should start with the field path {path!r}"
    assert problem in msg, msg


@pytest.mark.parametrize("doc", [None, [1, 2], "name: x"], ids=["none", "list", "string"])
def test_top_level_must_be_a_mapping(doc: Any) -> None:
    with pytest.raises(ScenarioError, match="mapping"):
        build(doc)


def test_the_base_document_is_valid() -> None:
    # Guards the negative cases above: each of them breaks exactly one thing of a valid document.
    sc = build(base())
    assert sc.name == "t"
    assert sc.horizon == 3600


# -- good input ----------------------------------------------------------------------------------------


def test_node_groups_expand_to_named_nodes() -> None:
    doc = base()
    doc["cluster"]["nodes"].append({"count": 3, "cpu": "500m", "memory": "1Gi", "labels": {"pool": "cpu"}})
    sc = build(doc)
    assert [n.name for n in sc.nodes] == ["a100-0", "a100-1", "node1-0", "node1-1", "node1-2"]
    gpu_node = sc.nodes[0]
    assert gpu_node.cpu_m == 64_000
    assert gpu_node.memory_mib == 512 * 1024
    assert len(gpu_node.gpus) == 8
    assert {g.model for g in gpu_node.gpus} == {"A100-80GB"}
    assert {g.memory_mib for g in gpu_node.gpus} == {80 * 1024}
    assert len({g.uuid for n in sc.nodes for g in n.gpus}) == 16
    cpu_node = sc.nodes[2]
    assert cpu_node.gpus == ()
    assert cpu_node.cpu_m == 500
    assert cpu_node.memory_mib == 1024
    assert cpu_node.labels == {"pool": "cpu"}


def test_zero_count_node_group_adds_no_nodes() -> None:
    doc = base()
    doc["cluster"]["nodes"].append({"count": 0, "name": "spare", "cpu": 1, "memory": "1Gi"})
    assert [n.name for n in build(doc).nodes] == ["a100-0", "a100-1"]


def test_workload_groups_expand_count_every_at() -> None:
    doc = base()
    doc["workloads"] = [
        {"queue": "team-a", "count": 3, "at": "1m", "every": "10s", "duration": "5m", "priority": 7},
        {"queue": "team-b", "name": "job", "count": 2, "duration": 30, "user": "bob"},
        {"queue": "team-b", "count": 0, "duration": 30},
    ]
    wls = build(doc).workloads
    assert [w.name for w in wls] == ["team-a-0-0", "team-a-0-1", "team-a-0-2", "job-0", "job-1"]
    assert [w.submit_time for w in wls] == [60.0, 70.0, 80.0, 0.0, 0.0]
    assert [w.queue for w in wls] == ["team-a"] * 3 + ["team-b"] * 2
    assert [w.duration for w in wls] == [300.0] * 3 + [30.0] * 2
    assert [w.priority for w in wls] == [7, 7, 7, 0, 0]
    assert wls[3].user == "bob"


def test_colliding_workload_names_are_rejected() -> None:
    doc = base()
    doc["workloads"] = [
        {"queue": "team-a", "name": "job", "duration": 30},
        {"queue": "team-b", "name": "job", "duration": 30},
    ]
    with pytest.raises(ScenarioError, match=r"^workloads: workload names collide"):
        build(doc)


def test_pods_make_a_gang() -> None:
    doc = base()
    wl0(doc)["pods"] = 4
    doc["workloads"].append({"queue": "team-b", "duration": "1m", "requests": {"nvidia.com/gpu": 2}})
    wls = build(doc).workloads
    gang = wls[0]
    assert len(gang.pods) == 4
    assert gang.gang
    assert len(set(gang.pod_names)) == 4
    single = wls[-1]
    assert len(single.pods) == 1
    assert not single.gang
    assert single.pods[0].gpu.count == 2


def durations(seed: int) -> list[float]:
    doc = base()
    doc["seed"] = seed
    wl0(doc).update(count=50, duration="10m", duration_max="30m")
    return [w.duration for w in build(doc).workloads]


def test_duration_spread_is_seeded_and_within_range() -> None:
    first = durations(3)
    assert first == durations(3)  # same seed, same run
    assert all(600.0 <= d <= 1800.0 for d in first)
    assert len(set(first)) > 40  # really drawn, not all the same
    assert max(first) - min(first) > 600.0  # spread over the range
    assert first != durations(4)


def test_duration_max_equal_to_duration_is_fixed() -> None:
    doc = base()
    wl0(doc).update(duration="10m", duration_max="10m")
    assert {w.duration for w in build(doc).workloads} == {600.0}


def test_gpu_requests_follow_hami_units_and_defaults() -> None:
    doc = base()
    doc["workloads"] = [
        {"queue": "team-a", "name": "mem", "duration": 1, "requests": {"nvidia.com/gpumem": "10k"}},
        {"queue": "team-a", "name": "mib", "duration": 1, "requests": {"nvidia.com/gpumem": 2048}},
        {
            "queue": "team-a",
            "name": "frac",
            "duration": 1,
            "requests": {
                "nvidia.com/gpucores": 25,
                "nvidia.com/gpumem": 10240,
                "cpu": "500m",
                "memory": "1G",
            },
        },
        {"queue": "team-a", "name": "whole", "duration": 1, "requests": {"nvidia.com/gpu": 2}},
        {"queue": "team-a", "name": "pct", "duration": 1, "requests": {"nvidia.com/gpumem-percentage": 50}},
        {"queue": "team-a", "name": "cpu", "duration": 1, "requests": {"cpu": 2}},
    ]
    pods = {w.name.rsplit("-", 1)[0]: w.pods[0] for w in build(doc).workloads}
    assert pods["mem"].gpu.count == 1  # gpumem alone implies one GPU
    assert pods["mem"].gpu.mem_mib == 10000  # the quantity's plain value is MiB, as HAMi reads it
    assert pods["mib"].gpu.mem_mib == 2048  # a plain number is MiB
    frac = pods["frac"]
    assert (frac.gpu.count, frac.gpu.cores, frac.gpu.mem_mib) == (1, 25, 10240)
    assert not frac.gpu.exclusive
    assert frac.cpu_m == 500
    assert frac.memory_mib == 954  # 1e9 bytes, rounded up to whole MiB
    whole = pods["whole"].gpu
    assert (whole.count, whole.cores, whole.mem_pct) == (2, 100, 100)
    assert whole.exclusive  # gpu alone means whole, exclusive cards
    assert pods["pct"].gpu.mem_pct == 50
    assert pods["cpu"].gpu is None
    assert pods["cpu"].cpu_m == 2000


def test_gpu_include_exclude_must_match_some_gpu() -> None:
    doc = base()
    wl0(doc)["gpu_include"] = ["H100"]
    with pytest.raises(ScenarioError, match=r"^workloads\[0\]\.requests: no GPU .* allowed model"):
        build(doc)
    wl0(doc)["gpu_include"] = ["a100"]  # case-insensitive substring
    assert build(doc).workloads[0].pods[0].gpu_include == ("a100",)


def test_queues_with_parents_weights_and_guarantees() -> None:
    doc = base()
    doc["queues"] = [
        {"name": "org"},
        {"name": "team-a", "parent": "org", "weight": 2, "guaranteed": {"nvidia.com/gpu": 4}},
        {"name": "team-b", "parent": "org", "limit": {"nvidia.com/gpu": 8, "cpu": 16}},
    ]
    sc = build(doc)
    tree = sc.tree()
    assert tree.leaf_names() == ["team-a", "team-b"]
    by_name = {q.name: q for q in sc.queues}
    assert by_name["team-a"].weight == 2
    assert by_name["team-a"].guaranteed[0] == 4
    assert by_name["team-b"].limit[0] == 8
    assert by_name["team-b"].limit[2] == 16_000  # cpu in millicores


def test_queue_fairness_keys_reach_the_engine() -> None:
    doc = base()
    doc["queues"][0].update(usage_half_life="1h", fair_within="users", starvation_after="5m")
    sc = build(doc)
    a, b = sc.queues
    assert (a.usage_half_life, a.fair_within, a.starvation_after) == (3600.0, "users", 300.0)
    assert (b.usage_half_life, b.fair_within, b.starvation_after) == (0.0, "fifo", 600.0)  # defaults
    assert sc.tree().half_life.tolist() == [3600.0, 0.0]


def test_fair_share_max_runtime_reaches_the_engine_unbounded_by_default() -> None:
    doc = base()
    doc["queues"][0]["preemption"] = {"fair_share": True, "fair_share_max_runtime": "30m"}
    a, b = build(doc).queues
    assert (a.preemption.fair_share_max_runtime, b.preemption.fair_share_max_runtime) == (1800.0, float("inf"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(90, 90.0), (1.5, 1.5), ("45", 45.0), ("30s", 30.0), ("10m", 600.0), ("8h", 28800.0), ("2d", 172800.0)],
)
def test_parse_duration(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["3 weeks", "-5", "10x", "", True])
def test_parse_duration_rejects(text: Any) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_builtin_scenarios_load() -> None:
    names = builtin_scenarios()
    assert {"demo", "priority-monopoly", "batch-monopoly"} <= set(names)
    for name in names:
        sc = load(name)
        assert sc.name == name
        assert sc.nodes
        assert sc.workloads
        assert names[name]  # each has a description


def test_load_unknown_name_is_one_line() -> None:
    with pytest.raises(ScenarioError) as info:
        load("no-such-scenario")
    msg = str(info.value)
    assert "\n" not in msg
    assert "'no-such-scenario'" in msg
    assert "demo" in msg  # lists the built-ins


def test_load_does_not_mutate_input() -> None:
    doc = base()
    before = copy.deepcopy(doc)
    build(doc)
    assert doc == before


def test_the_documented_example_scenario_loads() -> None:
    docs = Path(__file__).resolve().parents[1] / "docs" / "scenarios.md"
    text = docs.read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    sc = build(yaml.safe_load(example))
    assert sc.name == "two-teams"
    assert len(sc.nodes) == 2
    assert [w.name for w in sc.workloads][-4:] == ["train-0", "train-1", "train-2", "train-3"]
    assert all(w.gang for w in sc.workloads[-4:])
    infer = next(w for w in sc.workloads if w.name == "infer-0")
    assert infer.submit_time == 300
    assert (infer.pods[0].gpu.cores, infer.pods[0].gpu.mem_mib) == (25, 10240)
