"""Mutants of the code changed since 445efb4 (FairShare's `borrowed: soonest-end`, the two-order backlog, an
elastic workload's extra pod among the victims) that the suite let live (docs/testing.md, "changed since
445efb4"): each test fails on its mutant."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpu_node, tree, whole
from fairgpu.catalog import load_profile
from fairgpu.framework.backlog import Backlog
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model.pod import PodSpec, Workload
from fairgpu.model.queue import PreemptionPolicy, QueueSpec, QueueTree
from test_lending import Item, items, lending, timed


def test_a_queue_lends_once_its_own_order_holds_its_nominal_share_in_gpus_whatever_its_pods_size():
    """2-GPU jobs, a alone on 8 GPUs (nominal share: 4): its two oldest start in its own order, then its
    shortest on borrowed capacity (lending.py counts what a pod charges, not one unit per pod)."""
    s = Scheduler([gpu_node("n0", gpus=8)], tree("a", "b"), lending())
    for i in range(3):
        s.submit(replace(timed(f"long-{i}", "a", 1000.0, t=i), pods=(whole(2),)))
    for i in range(2):
        s.submit(replace(timed(f"short-{i}", "a", 100.0 + i, t=10 + i), pods=(whole(2),)))
    assert sorted(s.cycle(0).started) == ["long-0", "long-1", "short-0", "short-1"]


def test_adopted_work_fills_its_queues_own_share_so_borrowed_gpus_go_to_the_soonest_end_after_a_restart():
    """After a restart a holds 3 of 4 GPUs, found running (nominal share: 2): the free GPU is borrowed, so it
    goes to a's work that would have ended first, not to its oldest."""
    s = Scheduler([gpu_node("n0", gpus=4)], tree("a", "b"), lending())
    for i in range(3):
        w = timed(f"found-{i}", "a", 1000.0, t=i)
        s.adopt(w, [s.state.placement_for(w.pods[0], 0, range(i, i + 1))], started=0.0)
    s.submit(timed("old-long", "a", 1000.0, t=5))
    s.submit(timed("new-short", "a", 10.0, t=6))
    assert s.cycle(10).started == ["new-short"]


def test_in_a_queue_fair_among_users_equal_holders_go_by_their_oldest_work_and_one_holding_nothing_first():
    """Two users holding nothing: the one whose next workload is older goes first, whatever the order they
    were queued in (a workload is pushed back after every attempt); once u holds some, v goes first."""
    b: Backlog[Item] = Backlog(by_user=True)
    late = Item("v-late", (0.0, 5.0), (0.0, 5.0, 5.0), user="v")
    early = Item("u-early", (0.0, 1.0), (0.0, 1.0, 1.0), user="u")
    b.push(late)
    b.push(early)
    assert [it.name for it in b.ordered()] == ["u-early", "v-late"]
    assert b.peek().name == "u-early"
    b.account("u", 0.25)
    assert [it.name for it in b.ordered()] == ["v-late", "u-early"]
    assert b.pop().name == "v-late"


def test_a_backlog_popped_and_pushed_back_again_and_again_never_holds_more_than_twice_its_work_and_17():
    """The stale copies a pop leaves in the other order's heap are dropped as soon as a heap holds more than
    twice its live items and 16, at every step, not only in the end."""
    b: Backlog[Item] = Backlog(lends=True)
    for it in items()[:3]:
        b.push(it)
    for _ in range(100):
        b.push(b.pop(lend=True))
        assert max(len(h) for h in (*b._own.values(), *b._lend.values())) <= 2 * 3 + 17
    assert [b.pop().name for _ in range(3)] == ["w0", "w1", "w2"]


def _running(nodes, running) -> Scheduler:
    """Queue b, which evicts its own lower-priority work at once, running these (workload, placements,
    started), adopted in this order."""
    b = QueueSpec("b", preemption=PreemptionPolicy(within_queue="LowerPriority"))
    s = Scheduler(nodes, QueueTree([b]), load_profile("fairgpu"))
    for wl, placements, started in running:
        at = [s.state.placement_for(pod, node, slots) for pod, (node, slots) in zip(wl.pods, placements, strict=True)]
        s.adopt(wl, at, started)
    return s


@pytest.mark.parametrize("needs", ["a gpu", "cpu only"])
def test_an_extra_pod_goes_before_a_whole_workload_that_lost_less_work_on_another_node(needs):
    """n0: w0 (3 GPUs) and e's extra pod; n1: e's first pod and v (3 GPUs, started at 90 s: of the whole
    workloads, it loses least). u, urgent in the same queue, needs room one eviction makes on either node: a
    GPU, or 3.5 cores and no GPU. e's extra pod goes (extra pods before any whole workload), not v: the room
    it frees is priced at its own cost, though e's whole unit, adopted just before it, holds it too."""
    nodes = [gpu_node(f"n{i}", gpus=4, cpu_m=8000) for i in range(2)]
    s = _running(
        nodes,
        [
            (Workload("w0", "b", (whole(3, cpu_m=3000),)), [(0, (0, 1, 2))], 0.0),
            (Workload("v", "b", (whole(3, cpu_m=3000),)), [(1, (1, 2, 3))], 90.0),
            (Workload("e", "b", (whole(1, cpu_m=2000), whole(1, cpu_m=4000)), min_pods=1), [(1, (0,)), (0, (3,))], 0.0),
        ],
    )
    pod = whole(1, cpu_m=500) if needs == "a gpu" else PodSpec(cpu_m=3500, memory_mib=1024)
    s.submit(Workload("u", "b", (pod,), submit_time=100, priority=5))
    assert [(e.workload, e.pods) for e in s.cycle(100).evictions] == [("e", (1,))]
