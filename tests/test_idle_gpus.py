"""Idle GPUs by cause: every idle GPU-equivalent is attributed to exactly one cause, on hand-checked clusters."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import fraction, gpu_node, job, simulated, tree, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.idle import CAUSES
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import QueueSpec, QueueTree
from fairgpu.model.node import GpuDevice, NodeSpec
from fairgpu.plugins.sort import FairShare
from fairgpu.sim import scenario as scenarios


def causes(s: Scheduler, now: float = 0.0) -> dict[str, float]:
    out = s.idle_gpus(now)
    assert list(out) == list(CAUSES)
    idle = s.state.total_gpus - s.state.allocated_gpu_equivalents()
    assert sum(out.values()) == pytest.approx(idle, abs=1e-9)
    return {k: v for k, v in out.items() if v}


def test_nothing_pending_leaves_every_gpu_idle_for_want_of_work(two_nodes):
    s = Scheduler(two_nodes, tree("a"), load_profile("fairgpu"))
    assert causes(s) == {"no_fit": 16}
    s.submit(job("one", "a", whole(3)))
    s.cycle(0)
    assert causes(s) == {"no_fit": 13}


def test_fragmented_wrong_model_and_unhealthy_gpus_are_told_apart():
    a100 = ("A100",)
    broken = NodeSpec(
        "n2", 128_000, 1 << 20, (GpuDevice("A100-80GB", 81920), GpuDevice("A100-80GB", 81920, healthy=False))
    )
    nodes = [gpu_node("n0", gpus=4), gpu_node("n1", gpus=4, model="T4", mem_mib=16384), broken]
    s = Scheduler(nodes, tree("a"), load_profile("fairgpu"))
    s.submit(job("run", "a", whole(3, gpu_include=a100)))  # only n0 has 3 A100s
    s.submit(job("wide", "a", whole(2, gpu_include=a100), t=1))
    s.cycle(0)
    assert list(s.pending) == ["wide"]
    # n0: 1 free A100, too few for a 2-GPU pod that n0 could hold empty; n1: T4s nobody pending accepts;
    # n2: its one healthy A100 could never hold 2; its unhealthy one is unavailable.
    assert causes(s) == {"fragmented": 1, "no_fit": 5, "unavailable": 1}


def test_cpu_exhausted_node_with_free_gpus():
    s = Scheduler([gpu_node("n0", cpu_m=4000)], tree("a"), load_profile("fairgpu"))
    s.submit(job("cpu-heavy", "a", whole(1, cpu_m=3500)))
    s.submit(job("waits", "a", whole(1, cpu_m=1000), t=1))
    s.cycle(0)
    assert causes(s) == {"cpu_memory": 7}


def test_queue_limit_blocks_the_only_work_that_fits():
    limit = np.full(len(r.FAIR_DIMS), np.inf)
    limit[r.DIM_GPU] = 1
    s = Scheduler([gpu_node("n0", gpus=4)], QueueTree([QueueSpec("b", limit=limit)]), load_profile("fairgpu"))
    s.submit(job("first", "b", whole(1)))
    s.submit(job("second", "b", whole(1), t=1))
    s.cycle(0)
    assert causes(s) == {"limit": 3}


def test_gang_waiting_for_members_then_reserved_once_it_starves(two_nodes):
    for starvation_after, expect in ((600.0, {"gang": 8, "fragmented": 2}), (0.0, {"reserved": 10})):
        queues = QueueTree([QueueSpec("a", starvation_after=starvation_after)])
        s = Scheduler(two_nodes, queues, load_profile("fairgpu"))
        s.submit(job("filler", "a", whole(6)))
        s.submit(job("gang", "a", whole(4), pods=3, t=1))  # 12 GPUs, 10 free: each pod fits, the gang does not
        s.cycle(0)
        s.cycle(1)
        assert list(s.pending) == ["gang"]
        # Each 4-GPU pod fits on the empty node, not on the filler's (2 free): until the gang starves and
        # holds both nodes for when the filler ends.
        assert causes(s, 1) == expect, starvation_after


def test_fractional_idle_is_counted_in_gpu_equivalents():
    s = Scheduler([gpu_node("n0", gpus=1)], tree("a"), load_profile("fairgpu"))
    s.submit(job("third", "a", fraction(30, 8192)))
    s.cycle(0)
    assert causes(s) == {"no_fit": pytest.approx(0.7)}


@pytest.mark.parametrize("name", ["demo", "gang-starvation", "static-partition"])
@pytest.mark.parametrize("profile", ["fairgpu", "kube-default"])
def test_simulated_idle_gpu_hours_add_up_to_the_idle_capacity(name, profile):
    sc = scenarios.load(name)
    res = simulated(name, profile)
    total = sum(len(n.gpus) for n in sc.nodes) * res.horizon_s / 3600
    assert list(res.idle_gpu_hours) == list(CAUSES)
    assert sum(res.idle_gpu_hours.values()) == pytest.approx(total * (1 - res.utilization), rel=1e-9, abs=1e-9)
    assert res.to_json()["idle_gpu_hours"] == res.idle_gpu_hours


@pytest.mark.parametrize(("long_over_share", "expect"), [("hold", {"held": 2}), ("start", {"fragmented": 1})])
def test_gpus_the_over_share_hold_keeps_idle_are_held(long_over_share, expect):
    """8 GPUs, a and b entitled to 4 each: a holds 4, b 1 and waits with a 4-GPU job that does not fit the 3
    free GPUs. a's 300 s job starts; its 1,000 s job, above a's share and past b's starvation_after, is held
    back (long_over_share: hold): the 2 GPUs it would fit are idle because of the hold, not for want of a fit.
    Work-conserving, it starts, and the one GPU left is too few for b's job."""
    profile = replace(load_profile("fairgpu"), queue_sort=FairShare(long_over_share=long_over_share))
    s = Scheduler([gpu_node("n0")], tree("a", "b"), profile)
    for name, queue in (*((f"a-{i}", "a") for i in range(4)), ("b-run", "b")):
        s.submit(replace(job(name, queue, whole(1)), duration=1000.0))
    s.cycle(0)
    s.submit(replace(job("b-big", "b", whole(4), t=1), duration=1000.0))
    s.submit(replace(job("a-long", "a", whole(1), t=2), duration=1000.0))
    s.submit(replace(job("a-short", "a", whole(1), t=3), duration=300.0))
    assert "a-short" in s.cycle(4).started
    assert causes(s, 4) == expect
