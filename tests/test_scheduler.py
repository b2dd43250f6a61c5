"""The scheduling cycle: order, no head-of-line blocking, gangs, quotas, and the two profiles."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import fraction, gpu_node, job, tree, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.errors import RequestError
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.model import QueueSpec, QueueTree, Workload


def started(result: CycleResult) -> list[str]:
    return list(result.started)


def test_unschedulable_workload_does_not_block_the_ones_behind_it(two_nodes):
    s = Scheduler(two_nodes, tree("a"), load_profile("fairgpu"))
    s.submit(job("big", "a", whole(8), pods=3, t=0))  # 24 GPUs: never fits on 16
    s.submit(job("small", "a", whole(1), t=1))
    res = s.cycle(0)
    assert started(res) == ["small"]
    assert list(s.pending) == ["big"]
    s.state.check_invariants()


def test_gang_is_all_or_nothing_under_fairgpu(two_nodes):
    s = Scheduler(two_nodes, tree("a"), load_profile("fairgpu"))
    s.submit(job("filler", "a", whole(6), t=0))
    s.submit(job("gang", "a", whole(4), pods=3, t=1))  # needs 12 GPUs, 10 are free
    res = s.cycle(0)
    assert started(res) == ["filler"]
    assert not [b for b in res.bound if b.workload == "gang"]
    assert s.state.placement("gang-0") is None
    s.remove("filler")
    res = s.cycle(1)
    assert started(res) == ["gang"] and len(res.bound) == 3


def test_kube_default_places_gang_pods_one_by_one_and_holds_them(two_nodes):
    s = Scheduler(two_nodes, tree("a"), load_profile("kube-default"))
    s.submit(job("filler", "a", whole(6), t=0))
    s.submit(job("gang", "a", whole(4), pods=3, t=1))
    res = s.cycle(0)
    assert started(res) == ["filler"]
    assert sum(b.workload == "gang" for b in res.bound) == 2  # two pods hold 8 GPUs, the third waits
    assert s.state.node_idle_gpus.sum() == 2
    res = s.cycle(1)
    assert res.bound == []  # the third pod still cannot fit
    s.remove("filler")
    assert started(s.cycle(2)) == ["gang"]


def test_priority_sort_ignores_queues_fair_share_does_not():
    nodes = [gpu_node("n0", gpus=4)]
    for profile, expect in (("kube-default", {"a": 4, "b": 0}), ("fairgpu", {"a": 2, "b": 2})):
        s = Scheduler(nodes, tree("a", "b"), load_profile(profile))
        for i in range(10):
            s.submit(job(f"a{i}", "a", whole(1), t=0, priority=1000))
        for i in range(10):
            s.submit(job(f"b{i}", "b", whole(1), t=0))
        s.cycle(0)
        held = {q: s.view.usage[s.tree.index[q], r.DIM_GPU] for q in ("a", "b")}
        assert held == expect, profile


def test_priority_orders_workloads_inside_a_queue_under_fairgpu():
    s = Scheduler([gpu_node("n0", gpus=1)], tree("a"), load_profile("fairgpu"))
    s.submit(job("low", "a", whole(1), t=0, priority=0))
    s.submit(job("high", "a", whole(1), t=5, priority=10))
    assert started(s.cycle(5)) == ["high"]


def test_fair_share_follows_weights():
    nodes = [gpu_node("n0", gpus=8)]
    s = Scheduler(nodes, tree("a", "b", a=3.0), load_profile("fairgpu"))
    for q in ("a", "b"):
        for i in range(20):
            s.submit(job(f"{q}{i}", q, whole(1)))
    s.cycle(0)
    assert s.view.usage[:, r.DIM_GPU].tolist() == [6.0, 2.0]


def test_quota_limit_is_enforced_but_not_under_kube_default():
    limit = np.full(len(r.FAIR_DIMS), np.inf)
    limit[r.DIM_GPU] = 3
    queues = QueueTree([QueueSpec("a", limit=limit)])
    for profile, expect in (("fairgpu", 3), ("kube-default", 8)):
        s = Scheduler([gpu_node("n0")], queues, load_profile(profile))
        for i in range(10):
            s.submit(job(f"j{i}", "a", whole(1)))
        s.cycle(0)
        assert s.view.usage[0, r.DIM_GPU] == expect, profile


def test_fractional_pods_share_a_gpu_and_binpack_fills_the_fullest_gpu_first():
    s = Scheduler([gpu_node("n0", gpus=2)], tree("a"), load_profile("fairgpu"))
    for i in range(4):
        s.submit(job(f"f{i}", "a", fraction(25, 10_000), t=i))
    res = s.cycle(0)
    assert {b.placement.slots for b in res.bound} == {(0,)}  # all four on one GPU
    assert s.state.gpu_cores_free[0, :2].tolist() == [0, 100]
    s.submit(job("whole", "a", whole(1), t=9))
    assert started(s.cycle(1)) == ["whole"]
    s.state.check_invariants()


def test_least_allocated_spreads_over_nodes():
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], tree("a"), load_profile("kube-default"))
    s.submit(job("x", "a", whole(1, cpu_m=8000), t=0))
    s.submit(job("y", "a", whole(1, cpu_m=8000), t=1))
    res = s.cycle(0)
    assert sorted(b.placement.node for b in res.bound) == [0, 1]


def test_gpu_type_filter_restricts_models():
    nodes = [gpu_node("a100", model="A100-80GB"), gpu_node("l40", model="L40S-48GB", mem_mib=49152)]
    s = Scheduler(nodes, tree("a"), load_profile("fairgpu"))
    s.submit(job("x", "a", whole(1, gpu_include=("l40s",))))
    s.submit(job("y", "a", whole(1, gpu_exclude=("L40",)), t=1))
    res = s.cycle(0)
    by = {b.workload: s.state.node_names[b.placement.node] for b in res.bound}
    assert by == {"x": "l40", "y": "a100"}


def test_submit_rejects_what_can_never_run_and_keeps_state(two_nodes):
    s = Scheduler(two_nodes, tree("a"), load_profile("fairgpu"))
    with pytest.raises(RequestError, match=r"nvidia\.com/gpu 9"):
        s.submit(job("x", "a", whole(9)))
    with pytest.raises(RequestError, match="queue 'nope'"):
        s.submit(job("y", "nope", whole(1)))
    with pytest.raises(RequestError, match="allowed model"):
        s.submit(job("z", "a", whole(1, gpu_include=("H100",))))
    assert list(s.pending) == [] and not s.view.demand.any()


def test_remove_pending_partial_workload_releases_its_pods(two_nodes):
    s = Scheduler(two_nodes, tree("a"), load_profile("kube-default"))
    s.submit(job("gang", "a", whole(8), pods=3))
    s.cycle(0)
    assert s.state.node_idle_gpus.sum() == 0
    released = s.remove("gang")
    assert len(released) == 2 and s.state.node_idle_gpus.sum() == 16
    assert not s.view.usage.any() and not s.view.demand.any()
    s.state.check_invariants()


def test_stopping_steps_early_leaves_the_rest_pending(two_nodes):
    s = Scheduler(two_nodes, tree("a"), load_profile("fairgpu"))
    for i in range(5):
        s.submit(job(f"j{i}", "a", whole(1), t=i))
    result = CycleResult()
    steps = s.steps(0, result)
    next(steps)
    next(steps)
    steps.close()
    assert result.started == ["j0", "j1"]
    assert sorted(list(s.pending)) == ["j2", "j3", "j4"]
    assert started(s.cycle(1)) == ["j2", "j3", "j4"]


def test_cycle_counts_evaluated_attempts_apart_from_memo_skips(two_nodes):
    # benchmarks time real decisions apart from cache skips by these counters
    s = Scheduler(two_nodes, tree("a"), load_profile("kube-default"))
    s.submit(job("fits", "a", whole(6), t=0))
    s.submit(job("big", "a", whole(8), pods=3, t=1))  # evaluated: one pod places, then one fails
    s.submit(job("big-again", "a", whole(8), t=2))  # same shape as big's next pod: answered by the memo
    s.submit(job("small", "a", whole(1), t=3))
    result = s.cycle(0)
    assert result.attempts == 4
    assert result.evaluated == 3 and result.searches == 0
    # queues within an unbounded guarantee may reclaim: without one, nothing could be a victim and no search is set up
    unbounded = np.full(len(r.FAIR_DIMS), np.inf)
    queues = QueueTree([QueueSpec("a", guaranteed=unbounded), QueueSpec("b", guaranteed=unbounded)])
    s = Scheduler(two_nodes, queues, load_profile("fairgpu"))
    s.submit(job("big", "a", whole(8), pods=3, t=0))
    s.submit(job("big-b", "b", whole(8), pods=3, t=1))
    result = s.cycle(0)
    # b's gang of the same shape skips evaluation but still searches for victims for its own queue
    assert (result.attempts, result.evaluated, result.searches) == (2, 1, 2)


def test_hierarchical_queues_charge_the_parent():
    queues = QueueTree([QueueSpec("org"), QueueSpec("t1", parent="org"), QueueSpec("t2", parent="org")])
    s = Scheduler([gpu_node("n0")], queues, load_profile("fairgpu"))
    s.submit(job("x", "t1", whole(2)))
    s.submit(job("y", "t2", whole(3)))
    s.cycle(0)
    assert s.view.usage[queues.index["org"], r.DIM_GPU] == 5
    with pytest.raises(RequestError, match="child queues"):
        s.submit(job("z", "org", whole(1)))


def test_an_elastic_workload_starts_with_exactly_its_minimum_and_a_gang_one_short_waits():
    """Two free GPUs: an elastic workload of four 1-GPU pods with min_pods 2 starts on both; a gang of three
    waits whole (min_pods is the least that runs, not one less than what must)."""
    sched = Scheduler([gpu_node("n0", gpus=2)], tree("q"), load_profile("fairgpu"))
    sched.submit(Workload("e", "q", (whole(1),) * 4, duration=3600.0, min_pods=2))
    assert len(sched.cycle(0.0).bound) == 2 and "e" in sched.running
    rigid = Scheduler([gpu_node("n0", gpus=2)], tree("q"), load_profile("fairgpu"))
    rigid.submit(Workload("g", "q", (whole(1),) * 3, duration=3600.0))
    assert rigid.cycle(0.0).bound == [] and "g" in rigid.pending
