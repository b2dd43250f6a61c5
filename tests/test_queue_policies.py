"""Queue policies as a tenant sees them: who runs and how many GPUs each queue holds, in scenarios where a
wrong rule gives a different answer (static partitions, lendable guarantees, parent limits, the FairShare
tie-break, HAMi's per-GPU task limit, and backfill beside a reservation)."""

from __future__ import annotations

import numpy as np

from conftest import fraction, gpu_node, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import QueueSpec, QueueTree, Workload


def gpus(n: float) -> np.ndarray:
    return r.quota_vector({"nvidia.com/gpu": n}, default=np.inf)


def held(sched: Scheduler, queue: str) -> float:
    return float(sched.view.usage[sched.tree.index[queue], r.DIM_GPU])


def singles(queue: str, n: int, t: float = 0.0, duration: float = 3600.0, prefix: str = "") -> list[Workload]:
    name = prefix or queue
    return [Workload(f"{name}{i}", queue, (whole(1),), submit_time=t, duration=duration) for i in range(n)]


def engine(queues: list[QueueSpec], nodes: int = 1) -> Scheduler:
    return Scheduler([gpu_node(f"n{i}") for i in range(nodes)], QueueTree(queues), load_profile("fairgpu"))


def submit(sched: Scheduler, workloads: list[Workload]) -> None:
    for wl in workloads:
        sched.submit(wl)


def test_a_static_queues_idle_guarantee_is_never_borrowed_and_is_there_at_once():
    """A static queue's guarantee is a partition: while it is idle nobody borrows it, so when its work
    arrives it runs at once, without evicting anyone. A dynamic queue with the same guarantee lends it."""
    for allocation, borrowed in (("static", 5), ("dynamic", 8)):
        sched = engine([QueueSpec("a", guaranteed=gpus(3), allocation=allocation), QueueSpec("b")])
        submit(sched, singles("b", 8))
        sched.cycle(0.0)
        assert held(sched, "b") == borrowed, allocation
    # The static case: a's three GPUs wait for it.
    sched = engine([QueueSpec("a", guaranteed=gpus(3), allocation="static"), QueueSpec("b")])
    submit(sched, singles("b", 8))
    sched.cycle(0.0)
    submit(sched, singles("a", 4, t=10.0))
    result = sched.cycle(10.0)
    assert result.evictions == [] and sorted(result.started) == ["a0", "a1", "a2"]
    assert held(sched, "a") == 3  # and never above its guarantee, though it asked for four


def test_only_the_lendable_part_of_an_idle_guarantee_is_borrowed():
    """lendable: 1 of a guarantee of 4: others borrow one GPU of it, three stay free for the owner, who
    (unlike a static queue) may still grow past its guarantee when the cluster is idle."""
    sched = engine([QueueSpec("a", guaranteed=gpus(4), lendable=gpus(1)), QueueSpec("b")])
    submit(sched, singles("b", 8))
    sched.cycle(0.0)
    assert held(sched, "b") == 5
    submit(sched, singles("a", 3, t=10.0))
    result = sched.cycle(10.0)
    assert result.evictions == [] and held(sched, "a") == 3
    alone = engine([QueueSpec("a", guaranteed=gpus(4), lendable=gpus(1)), QueueSpec("b")])
    submit(alone, singles("a", 6))
    alone.cycle(0.0)
    assert held(alone, "a") == 6


def test_a_parent_limit_caps_its_children_together():
    """Parent `p` has a limit of 4 GPUs; each child alone is unlimited. Together they never hold more
    than 4, and the GPUs they may not take go to the other tenant."""
    sched = engine(
        [
            QueueSpec("p", limit=gpus(4)),
            QueueSpec("c1", parent="p"),
            QueueSpec("c2", parent="p"),
            QueueSpec("o"),
        ]
    )
    submit(sched, singles("c1", 3) + singles("c2", 3))
    sched.cycle(0.0)
    assert held(sched, "c1") + held(sched, "c2") == 4 and held(sched, "p") == 4
    assert held(sched, "c1") == held(sched, "c2") == 2  # split fairly inside the parent
    submit(sched, singles("o", 4, t=10.0))
    sched.cycle(10.0)
    assert held(sched, "o") == 4 and held(sched, "p") == 4


def test_fair_share_breaks_a_share_ratio_tie_by_current_usage():
    """a (weight 3) holds 3 GPUs of its 6, b (weight 1) 1 of its 2: both at half their entitlement. One
    4-GPU job fits; b holds fewer GPUs, so b's goes first, though a's was submitted earlier and a comes
    first in the tree."""
    sched = engine([QueueSpec("a", weight=3), QueueSpec("b", weight=1), QueueSpec("c", weight=4)], nodes=2)
    submit(sched, singles("a", 3) + singles("b", 1) + singles("c", 8))
    sched.cycle(0.0)
    sched.submit(Workload("a-big", "a", (whole(4),), submit_time=0.5, duration=3600.0))
    sched.submit(Workload("b-big", "b", (whole(4),), submit_time=0.9, duration=3600.0))
    sched.refresh_shares(1.0)
    a, b = sched.tree.index["a"], sched.tree.index["b"]
    assert sched.view.share_ratio[a] == sched.view.share_ratio[b] == 0.5  # the tie this test is about
    result = sched.cycle(1.0)
    assert result.started == ["b-big"] and "a-big" in sched.pending


def test_a_gpu_at_its_hami_task_limit_takes_no_more_tasks():
    """n0's one GPU takes at most 2 tasks (deviceSplitCount 2), n1's ten. Fractional pods that would fit
    n0's GPU by cores and memory go to n1 once n0 holds two, and none is placed past the limit."""
    nodes = [gpu_node("n0", gpus=1, split_count=2), gpu_node("n1", gpus=1, split_count=10, mem_mib=40960)]
    sched = Scheduler(nodes, QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    for i in range(5):
        sched.submit(Workload(f"f{i}", "q", (fraction(10, 1000),), duration=3600.0))
    result = sched.cycle(0.0)
    assert len(result.started) == 5
    per_node = np.bincount([b.placement.node for b in result.bound], minlength=2)
    assert per_node[0] == 2 and per_node[1] == 3
    sched.state.check_invariants()
    one = Scheduler([nodes[0]], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    for i in range(3):
        one.submit(Workload(f"f{i}", "q", (fraction(10, 1000),), duration=3600.0))
    assert len(one.cycle(0.0).started) == 2 and list(one.pending) == ["f2"]


def test_work_that_ends_before_a_reservation_backfills_beside_it_and_longer_work_does_not():
    """A starving 8-GPU gang waits for the node (held for it until the running 6-GPU job ends at 3600 s).
    A 1-GPU job of 10 minutes backfills on the held node; a 1-GPU job of 2 hours does not."""
    sched = engine([QueueSpec("q", starvation_after=0.0)])
    sched.submit(Workload("long", "q", (whole(6),), duration=3600.0))
    sched.cycle(0.0)
    sched.submit(Workload("gang", "q", (whole(1),) * 8, submit_time=1.0, duration=3600.0))
    sched.cycle(1.0)
    assert "gang" in sched.reservations and sched.reservations["gang"].fit.at == 3600.0
    sched.submit(Workload("short", "q", (whole(1),), submit_time=2.0, priority=-1, duration=600.0))
    sched.submit(Workload("late", "q", (whole(1),), submit_time=2.0, priority=-1, duration=7200.0))
    result = sched.cycle(2.0)
    assert result.started == ["short"] and "late" in sched.pending
    sched.remove("short")
    sched.remove("long")
    assert sched.cycle(3600.0).started == ["gang"]  # the reservation was kept for it


def test_a_refusal_for_unlent_guarantee_names_the_resource_that_guarantee_holds_back():
    """A pending workload's reason names the dimension where another queue's idle guarantee is what it lacks:
    CPU here, though `a` also holds back an idle GPU (the workload needs no more GPUs than are free beside
    it), and though `a`'s idle CPU is a single millicore (a runs 7,999 m of its 8,000 m); CPU again when the
    GPUs are short too but no guarantee holds them back; and no guarantee at all is blamed when only the
    GPUs are short (the cluster is simply full there)."""
    unlent = "quota: the free cpu is other queues' guarantee, which they do not lend"
    static = r.quota_vector({"nvidia.com/gpu": 2, "cpu": "8"}, default=np.inf)
    sched = engine([QueueSpec("a", guaranteed=static, allocation="static"), QueueSpec("b")])
    submit(sched, [Workload("a0", "a", (whole(1, cpu_m=7_999),), submit_time=0.0, duration=3600.0)])
    sched.cycle(0.0)
    assert held(sched, "a") == 1
    submit(sched, [Workload("big", "b", (whole(1, cpu_m=120_001),), submit_time=1.0, duration=3600.0)])
    sched.cycle(1.0)
    assert "big" in sched.pending and sched.explain("big", 1.0).reasons[0] == unlent

    static = r.quota_vector({"cpu": "8"}, default=np.inf)
    sched = engine([QueueSpec("a", guaranteed=static, allocation="static"), QueueSpec("b")])
    submit(sched, singles("b", 8))
    sched.cycle(0.0)
    submit(sched, [Workload("more", "b", (whole(1, cpu_m=115_000),), submit_time=1.0, duration=3600.0)])
    submit(sched, [Workload("one", "b", (whole(1),), submit_time=1.0, duration=3600.0)])
    sched.cycle(1.0)
    assert sched.explain("more", 1.0).reasons[0] == unlent
    assert sched.explain("one", 1.0).reasons == ["no fit: 0/1 nodes: 1 too few idle GPUs"]
