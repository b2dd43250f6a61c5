"""A preemption search is set up only where a victim could be found (Preempt.may_find): skipped where the
preemptor's queue policy can take nothing, made — and evicting — wherever reclaim, fair share or priority
within the queue could."""

from __future__ import annotations

import numpy as np

from conftest import gpu_node, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.model import QueueSpec, QueueTree, Workload
from fairgpu.model.queue import PreemptionPolicy


def gpus(n: float) -> np.ndarray:
    return r.quota_vector({"nvidia.com/gpu": n}, default=np.inf)


def contest(
    a: QueueSpec, a_holds: int, b_policy: PreemptionPolicy = PreemptionPolicy(), priority: int = 0
) -> CycleResult:
    """One 8-GPU node: a runs `a_holds` 1-GPU jobs and b the rest from 0 s; at 100 s a 1-GPU job of
    `priority` arrives in a (in b when a_holds < 0, b then running all 8). The result of its cycle."""
    sched = Scheduler([gpu_node("n0")], QueueTree([a, QueueSpec("b", preemption=b_policy)]), load_profile("fairgpu"))
    held = max(a_holds, 0)
    for i in range(8):
        queue = "a" if i < held else "b"
        sched.submit(Workload(f"{queue}{i}", queue, (whole(1),), submit_time=0.0, duration=36000.0))
    assert len(sched.cycle(0.0).bound) == 8
    queue = "b" if a_holds < 0 else "a"
    sched.submit(Workload("new", queue, (whole(1),), submit_time=100.0, priority=priority, duration=36000.0))
    return sched.cycle(100.0)


def test_no_search_where_the_preemptors_queue_may_take_nothing():
    # no guarantee to reclaim, no fair share, no priority within the queue: nothing could be a victim
    assert contest(QueueSpec("a"), 0).searches == 0
    # a guarantee it is already at: with the new job it would be above it, and reclaim needs it within
    assert contest(QueueSpec("a", guaranteed=gpus(4)), 4).searches == 0
    # b may evict its own lower-priority work only if its policy says so
    assert contest(QueueSpec("a"), -1, priority=1).searches == 0


def test_a_queue_that_could_take_still_searches_and_evicts():
    # reclaim: within its guarantee with the new job, from b borrowing above its own (none)
    reclaim = contest(QueueSpec("a", guaranteed=gpus(4)), 3)
    assert (reclaim.searches, len(reclaim.evictions)) == (1, 1)
    # fair share: a holds nothing, b all 8 with an equal weight
    fair = contest(QueueSpec("a", preemption=PreemptionPolicy(reclaim=False, fair_share=True)), 0)
    assert (fair.searches, len(fair.evictions)) == (1, 1)
    # priority within b: a higher-priority job of b evicts one of b's own
    within = contest(QueueSpec("a"), -1, PreemptionPolicy(within_queue="LowerPriority"), priority=1)
    assert (within.searches, len(within.evictions)) == (1, 1)
    assert within.evictions[0].workload.startswith("b")
