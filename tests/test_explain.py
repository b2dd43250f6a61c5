"""Explanations: why a workload is pending, where it stands, and when it should start."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import gpu_node, job, starving_gang_beside_a_stream, tree, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.cli import app
from fairgpu.framework.placement import filter_breakdown, place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuDevice, NodeSpec, PodSpec, QueueSpec, QueueTree
from fairgpu.model.pod import GpuRequest


def test_no_fit_counts_nodes_per_reason():
    nodes = [gpu_node(f"a{i}") for i in range(3)] + [gpu_node("l0", model="L40S", mem_mib=49152)]
    s = Scheduler(nodes, tree("a"), load_profile("fairgpu"))
    s.submit(job("filler", "a", whole(8), pods=3))
    s.cycle(0)
    big_mem = PodSpec(cpu_m=100, memory_mib=100, gpu=GpuRequest(1, 10, 60_000))
    s.submit(job("x", "a", big_mem, t=1))
    s.cycle(1)
    exp = s.explain("x", 1)
    assert exp.state == "pending"
    assert exp.reasons == ["no fit: 0/4 nodes: 3 insufficient GPU cores, 1 insufficient GPU memory"]


def test_model_exclusion_is_named():
    nodes = [gpu_node("a0"), gpu_node("l0", model="L40S", mem_mib=49152)]
    s = Scheduler(nodes, tree("a"), load_profile("fairgpu"))
    s.submit(job("filler", "a", whole(8)))
    s.cycle(0)
    s.submit(job("x", "a", whole(1, gpu_include=("A100",)), t=1))
    s.cycle(1)
    assert s.explain("x", 1).reasons == ["no fit: 0/2 nodes: 1 GPU model excluded, 1 too few idle GPUs"]


def test_quota_refusal_is_named_and_start_estimated():
    limit = np.full(len(r.FAIR_DIMS), np.inf)
    limit[r.DIM_GPU] = 2
    queues = QueueTree([QueueSpec("a", limit=limit)])
    s = Scheduler([gpu_node("n0")], queues, load_profile("fairgpu"))
    for i in range(3):
        s.submit(job(f"j{i}", "a", whole(1), t=i))
    s.cycle(0)
    exp = s.explain("j2", 0)
    assert exp.reasons[0] == "quota: queue a would exceed its gpu limit"
    assert (exp.position_in_queue, exp.queue_pending) == (1, 1)


def test_gang_incomplete_and_estimated_start_from_running_ends():
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], tree("a"), load_profile("fairgpu"))
    s.submit(job("filler", "a", whole(6)))  # runs 60 s
    s.cycle(0)
    s.submit(job("gang", "a", whole(4), pods=3, t=10))  # 12 GPUs, 10 free
    s.cycle(10)
    exp = s.explain("gang", 10)
    assert exp.reasons == ["gang incomplete: 2 of 3 pods fit at once"]
    assert exp.estimated_start == pytest.approx(60.0)  # when filler ends


def test_fair_share_wait_and_cluster_position():
    s = Scheduler([gpu_node("n0", gpus=2)], tree("a", "b"), load_profile("fairgpu"))
    for i in range(4):
        s.submit(job(f"a{i}", "a", whole(1), t=0))
    s.cycle(0)  # a holds both GPUs
    s.submit(job("b0", "b", whole(1), t=1))
    s.submit(job("a9", "a", whole(1), t=1))
    exp_b, exp_a = s.explain("b0", 1), s.explain("a9", 1)
    assert exp_b.position_in_cluster == 1  # b is furthest below its share
    assert exp_a.position_in_cluster == 4 and exp_a.position_in_queue == 3
    assert exp_b.reasons[0].startswith("no fit")
    assert exp_b.estimated_start == pytest.approx(60.0)


def test_reserved_nodes_are_explained_to_the_others():
    s = starving_gang_beside_a_stream()
    assert list(s.reservations) == ["gang"]
    assert any(x.startswith("starving: 2 node(s) reserved") for x in s.explain("gang", 1).reasons)
    s.remove("s0")  # one GPU frees; a long stream job may not take it
    s.submit(job("late", "stream", whole(1), t=2))
    s.cycle(2)
    assert "late" in s.pending
    assert s.explain("late", 2).reasons == ["reserved for another workload: nodes held for gang until t=1m"]


def test_running_and_unknown_workloads():
    s = Scheduler([gpu_node("n0")], tree("a"), load_profile("fairgpu"))
    s.submit(job("x", "a", whole(1)))
    s.cycle(5)
    exp = s.explain("x", 5)
    assert (exp.state, exp.started) == ("running", 5)
    with pytest.raises(KeyError):
        s.explain("nope", 5)


def test_cli_explain_prints_for_each_profile_and_as_json():
    result = CliRunner().invoke(app, ["simulate", "--scenario", "gang-starvation", "--explain", "gang-0@61m"])
    assert result.exit_code == 0, result.output
    assert "kube-default at t=1h1m" in result.output and "fairgpu at t=1h1m" in result.output
    assert "submitted at t=1h\n" in result.output  # human times, not raw seconds
    assert "estimated start" in result.output
    result = CliRunner().invoke(
        app, ["simulate", "--scenario", "gang-starvation", "--profile", "fairgpu", "--explain", "gang-0@61m", "--json"]
    )
    doc = json.loads(result.stdout)
    assert doc["state"] == "pending" and doc["estimated_start"] > 3660
    assert any(x.startswith("starving") for x in doc["reasons"])


def test_cli_explain_rejects_unknown_workload():
    result = CliRunner().invoke(app, ["simulate", "--scenario", "demo", "--explain", "nope@1h"])
    assert result.exit_code == 2
    assert "--explain: no workload named 'nope'" in result.output


def test_every_pending_workload_gets_a_reason_before_any_is_told_again():
    """The live reporter explains pending workloads within a budget per pass. Before, it went in submission
    order: once the first ones were due again (10 s on) they took the budget back, and with more pending
    than a pass covers the newest never got a reason (the long soak's "lost" pods, pending with none)."""
    from itertools import islice

    from fairgpu.k8s.reporter import Reporter

    s = Scheduler([gpu_node("a0")], tree("a"), load_profile("fairgpu"))
    s.submit(job("filler", "a", whole(8)))
    s.cycle(0)
    for i in range(12):
        s.submit(job(f"w{i:02d}", "a", whole(1), t=1))
    s.cycle(1)
    told: list[str] = []
    placed: list[str] = []  # the quick first reason each gets at once: its queue and place

    class Recording(Reporter):
        def unschedulable(self, key: str, uid: str, message: str) -> None:
            (placed if message.endswith("a full explanation follows") else told).append(key)

    reporter = Recording(None, "fairgpu", explain_every=10.0)  # type: ignore[arg-type]
    for n in range(3):  # passes 10 s apart, each with room for 4 explanations
        steps = reporter.report_pending(s, lambda name: (name,), lambda k: True, lambda k: "uid", 1 + 10 * n)
        list(islice(steps, 4))
        if n == 0:
            assert sorted(placed) == [f"w{i:02d}" for i in range(12)]  # every one told something at once
    assert sorted(told) == [f"w{i:02d}" for i in range(12)] and len(placed) == 12


def test_each_node_is_explained_by_the_one_need_it_misses_and_an_exact_fit_fits():
    """A pod of 40 % of a GPU and half its memory (40,960 MiB of an 80 GiB card), 4 cores and 4 GiB, on 1-GPU
    nodes: `exact` has exactly that much of each left and takes it; `cores` is one core short, `full` has none,
    `mem` is one MiB short, `tasks` is at its task limit (split 1), `cpu` is one millicore short. A share
    asking for no cores still needs a card with a core free (`full` has none; `tasks` is still at its limit);
    a whole card asking for all of its memory fits."""

    def node(name: str, cpu_m: int = 8_000, split: int = 10) -> NodeSpec:
        return gpu_node(name, gpus=1, cpu_m=cpu_m, memory_mib=8_192, split_count=split)

    def share(cores: int, mem: int, cpu_m: int = 100, memory_mib: int = 100) -> PodSpec:
        return PodSpec(cpu_m=cpu_m, memory_mib=memory_mib, gpu=GpuRequest(1, cores, mem))

    nodes = [node("exact"), node("cores"), node("full"), node("mem"), node("tasks", split=1), node("cpu", 3_999)]
    profile = load_profile("fairgpu")
    view = Scheduler(nodes, tree("a"), profile).view
    running = [(0, share(60, 40_960, 4_000, 4_096)), (1, share(61, 100)), (2, share(50, 100)), (2, share(50, 100))]
    running += [(3, share(10, 40_961)), (4, share(1, 1))]
    for i, (n, pod) in enumerate(running):
        view.state.assign(f"r{i}", view.state.placement_for(pod, n, (0,)))
    pod = PodSpec(cpu_m=4_000, memory_mib=4_096, gpu=GpuRequest(1, 40, 0, 50))
    why = {
        "insufficient GPU cores": 2,
        "insufficient GPU memory": 1,
        "GPU task limit reached": 1,
        "insufficient CPU": 1,
    }
    assert filter_breakdown(pod, view, profile) == (1, why)
    assert place_pod(pod, view, profile).node == 0
    assert filter_breakdown(share(0, 100), view, profile) == (
        4,
        {"insufficient GPU cores": 1, "GPU task limit reached": 1},
    )
    idle = Scheduler([gpu_node("n", gpus=1)], tree("a"), profile).view
    assert place_pod(PodSpec(cpu_m=100, memory_mib=100, gpu=GpuRequest(1, 100, 81_920)), idle, profile) is not None


def test_a_node_with_exactly_enough_gpus_of_the_allowed_model_is_not_told_the_model_is_excluded():
    """A 2-GPU pod for A100s only: `exact` has two idle A100s and fits; `mixed` has two A100s (one busy) and two
    idle T4s, so it lacks no model, only two free A100s at once."""
    a100, t4 = GpuDevice("A100-80GB", 81_920, "a"), GpuDevice("T4", 15_360, "t")
    nodes = [NodeSpec("exact", 64_000, 1 << 18, (a100, a100)), NodeSpec("mixed", 64_000, 1 << 18, (a100, a100, t4, t4))]
    profile = load_profile("fairgpu")
    view = Scheduler(nodes, tree("a"), profile).view
    view.state.assign("busy", view.state.placement_for(whole(1), 1, (0,)))
    assert filter_breakdown(whole(2, gpu_include=("A100",)), view, profile) == (
        1,
        {"no set of free GPUs meets every need": 1},
    )
