"""Backfill into room held for a starving gang: short work uses it, nothing delays the gang's start."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import gpu_node, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.durations import MARGIN, MIN_SAMPLES, PERCENTILE
from fairgpu.framework.interfaces import Profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import QueueSpec, QueueTree
from fairgpu.model.pod import Workload
from fairgpu.model.queue import PreemptionPolicy


def wl(name: str, queue: str, gpus: int, duration: float, t: float = 0.0) -> Workload:
    return Workload(name, queue, (whole(gpus),), submit_time=t, duration=duration)


def test_short_job_behind_a_long_one_backfills_and_the_gang_starts_when_reserved():
    nodes = [gpu_node("n0"), gpu_node("n1")]
    queues = QueueTree([QueueSpec("stream"), QueueSpec("training", starvation_after=0)])
    s = Scheduler(nodes, queues, load_profile("fairgpu"))
    for name, node, slots, duration in (("a", 0, range(4), 20), ("b", 0, range(4, 8), 100), ("c", 1, range(8), 1000)):
        w = wl(name, "stream", len(slots), duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, slots)], started=0.0)
    s.submit(wl("gang", "training", 8, 3600))
    s.cycle(0)
    (res,) = s.reservations.values()
    assert res.workload == "gang" and res.fit.at == 100 and list(res.fit.nodes) == [0]  # n0 frees first
    # In the stream's FIFO order: one too long to end before the gang's start, one ending 10 s after it,
    # then one that ends 30 s before it: only that one may use the held node.
    s.submit(wl("long", "stream", 1, 500, t=1))
    s.submit(wl("late", "stream", 1, 90, t=2))
    s.submit(wl("short", "stream", 1, 50, t=3))
    s.remove("a")
    assert s.cycle(20).started == ["short"]
    assert s.status("short").placements[0].node == 0
    assert sorted(s.pending) == ["gang", "late", "long"]
    s.remove("short")  # ended at 70
    s.remove("b")
    assert s.cycle(100).started[0] == "gang"  # at the reserved time: the backfill delayed nothing


def learn(s: Scheduler, queue: str, runs: list[float]) -> None:
    """Workloads of `queue` that ran `runs` seconds each and completed (on node 1, kept free for this)."""
    for i, ran in enumerate(runs):
        w = Workload(f"{queue}-done-{i}", queue, (whole(1),))
        s.adopt(w, [s.state.placement_for(w.pods[0], 1, range(1))], started=0.0)
        s.remove(w.name, finished_at=ran)


def test_a_queue_learns_a_pessimistic_duration_from_completed_runs_only():
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    learn(s, "q", [100.0] * (MIN_SAMPLES - 1))
    assert s.durations.learned(0) is None  # too few runs to say anything
    w = Workload("evicted", "q", (whole(1),))
    s.adopt(w, [s.state.placement_for(w.pods[0], 1, range(1))], started=0.0)
    s.remove("evicted")  # evicted or deleted: says nothing about how long the queue's work runs
    assert s.durations.learned(0) is None
    learn(s, "q", [1000.0])
    runs = [100.0] * (MIN_SAMPLES - 1) + [1000.0]
    assert s.durations.learned(0) == pytest.approx(float(np.percentile(runs, PERCENTILE)) * MARGIN)
    assert s.durations.learned(0) > 100.0 * MARGIN  # the slow run weighs in: the estimate errs long
    assert s.durations.of(wl("declared", "q", 1, 7.0), 0) == 7.0  # a workload's own duration wins


def reserved_gang(learned: list[float] | None = None) -> Scheduler:
    """n0 runs 'long' (7 of its 8 GPUs, declared to end at 1000); the training gang (8 GPUs) reserves n0 for
    then, and n0's eighth GPU is free meanwhile. n1 is full of 'other' until 5000. The stream queue may have
    learned its run times."""
    s = Scheduler(
        [gpu_node("n0"), gpu_node("n1")],
        QueueTree([QueueSpec("stream"), QueueSpec("training", starvation_after=0)]),
        load_profile("fairgpu"),
    )
    if learned:
        learn(s, "stream", learned)
    for name, node, gpus, end in (("long", 0, 7, 1000.0), ("other", 1, 8, 5000.0)):
        w = wl(name, "training" if name == "other" else "stream", gpus, end)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, range(gpus))], started=0.0)
    s.submit(wl("gang", "training", 8, 3600))
    s.cycle(0)
    assert s.reservations["gang"].fit.at == 1000 and list(s.reservations["gang"].fit.nodes) == [0]
    return s


def test_work_of_unknown_length_backfills_by_its_queues_learned_estimate():
    s = reserved_gang(learned=[100.0] * MIN_SAMPLES)  # stream's estimate: 125 s
    s.submit(Workload("fits", "stream", (whole(1),), submit_time=500))
    assert s.cycle(500).started == ["fits"]  # 500 + 125 <= 1000: it may use the held node
    s.submit(Workload("too-late", "stream", (whole(1),), submit_time=900))
    assert s.cycle(900).started == []  # 900 + 125 > 1000


def test_no_backfill_without_a_duration_or_an_estimate():
    s = reserved_gang()
    s.submit(Workload("unknown", "stream", (whole(1),), submit_time=500))
    assert s.cycle(500).started == []


def test_backfill_that_overruns_is_evicted_when_the_reservation_comes_due_and_the_gang_starts_on_time():
    s = reserved_gang()
    s.submit(wl("short", "stream", 1, 50, t=500))  # declared 50 s: may backfill
    assert s.cycle(500).started == ["short"]
    # 550 passes and 'short' still runs (its declared duration was wrong); the gang is due at 1000
    s.remove("long", finished_at=1000)
    result = s.cycle(1000)
    assert [(e.workload, e.at) for e in result.evictions] == [("short", 1000.0)]
    assert "gang" in result.evictions[0].reason
    assert s.reservations["gang"].fit.at == 1000  # still held for the gang: nobody else takes n0
    s.remove("short")  # the driver carried out the eviction
    assert s.cycle(1000).started == ["gang"]


def test_a_starving_gang_keeps_its_nodes_while_their_earlier_work_overruns_its_estimate():
    s = Scheduler(
        [gpu_node("n0"), gpu_node("n1")],
        QueueTree([QueueSpec("stream"), QueueSpec("training", starvation_after=0)]),
        load_profile("fairgpu"),
    )
    learn(s, "stream", [100.0] * MIN_SAMPLES)  # estimate 125 s; nothing declares a duration below
    for name, node, slots, start in (("a", 0, range(4), 0.0), ("b", 0, range(4, 8), 0.0), ("c", 1, range(8), 100.0)):
        w = Workload(name, "stream", (whole(len(slots)),))
        s.adopt(w, [s.state.placement_for(w.pods[0], node, slots)], started=start)
    s.submit(Workload("gang", "training", (whole(8),), duration=3600))
    s.cycle(0)
    assert s.reservations["gang"].fit.at == 125 and list(s.reservations["gang"].fit.nodes) == [0]
    s.remove("a", finished_at=130)
    s.submit(Workload("d", "stream", (whole(4),), submit_time=130))
    # 'b' overran its estimate: n0 is still draining for the gang, and 'd' must not take a's GPUs
    assert s.cycle(130).started == []
    assert list(s.reservations["gang"].fit.nodes) == [0]
    s.remove("b", finished_at=150)
    assert s.cycle(150).started[0] == "gang"


def test_a_starving_workload_that_takes_over_a_due_hold_starts_in_it_at_once():
    # y holds the only GPU for when x ends. At that instant z, of higher priority and so ahead of y in its
    # queue's order, takes the hold over. The GPU is free: z must start on it now, not hold it idle until
    # some later event (here there is none, so it would idle for good) while y loses its turn anyway.
    s = Scheduler([gpu_node("n0", gpus=1)], QueueTree([QueueSpec("q", starvation_after=0)]), load_profile("fairgpu"))
    x = wl("x", "q", 1, 100)
    s.adopt(x, [s.state.placement_for(x.pods[0], 0, [0])], started=0.0)
    s.submit(wl("y", "q", 1, 1000, t=1))
    s.cycle(1)
    assert s.reservations["y"].fit.at == 100
    s.remove("x", finished_at=100)
    s.submit(Workload("z", "q", (whole(1),), submit_time=100, priority=10, duration=1000))
    assert s.cycle(100).started == ["z"]
    assert s.reservations["y"].fit.at == 1100  # y holds the GPU again, for when z ends


def _gang_held_on_n0_with_short_backfilled_there(stream: QueueSpec) -> Scheduler:
    """n0 held for the starving 8-GPU gang of `training` from 100 s (a ends at 20 s, b at 100 s; c fills n1 until
    1000 s); `short` of `stream` backfills n0's freed half at 20 s (ends 80 s); x may evict for fair share."""
    from fairgpu.model.queue import PreemptionPolicy

    x = QueueSpec("x", preemption=PreemptionPolicy(fair_share=True))
    queues = QueueTree([stream, QueueSpec("training", starvation_after=0), x])
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], queues, load_profile("fairgpu"))
    for name, node, slots, duration in (("a", 0, range(4), 20), ("b", 0, range(4, 8), 100), ("c", 1, range(8), 1000)):
        w = wl(name, "stream", len(slots), duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, slots)], started=0.0)
    s.submit(wl("gang", "training", 8, 3600))
    s.cycle(0)
    assert list(s.reservations["gang"].fit.nodes) == [0] and s.reservations["gang"].fit.at == 100
    s.remove("a")
    s.submit(wl("short", "stream", 4, 60, t=20))
    assert s.cycle(20).started == ["short"] and s.status("short").placements[0].node == 0
    return s


def test_a_preemptor_does_not_evict_backfill_to_run_past_a_starving_gangs_start():
    """n0 is held for the starving 8-GPU gang from 100 s; `short` backfills half of it (ends 80 s). x, below
    its fair share, wants 4 GPUs for an hour at 30 s: the cheapest victim is `short`, on the held node, but x
    would still run there at 100 s. So x evicts on n1 instead, and the gang starts at 100 s as planned."""
    s = _gang_held_on_n0_with_short_backfilled_there(QueueSpec("stream"))
    s.submit(wl("x1", "x", 4, 3600, t=30))
    assert [e.workload for e in s.cycle(30).evictions] == ["c"]
    s.remove("c")
    assert s.cycle(30).started == ["x1"] and s.status("x1").placements[0].node == 1
    s.remove("short")
    s.cycle(80)
    s.remove("b")
    assert s.cycle(100).started == ["gang"]


def test_a_preemptor_plans_around_a_starving_gangs_hold_from_when_its_victims_grace_ends():
    """As above, with a 40 s grace period and x1 a minute long. Started at 30 s, x1 would end before the
    gang's 100 s; but it starts only once its victims' grace has passed (70 s), and would then run past it.
    So x1 still evicts on n1, not the backfill on the held node."""
    from fairgpu.model.queue import PreemptionPolicy

    s = _gang_held_on_n0_with_short_backfilled_there(QueueSpec("stream", preemption=PreemptionPolicy(grace_period=40)))
    s.submit(wl("x1", "x", 4, 60, t=30))
    assert [(e.workload, e.at) for e in s.cycle(30).evictions] == [("c", 70)]


def test_a_preemptor_whose_victims_left_starts_in_its_own_room_not_on_a_starving_gangs_nodes():
    """As above, but without backfill on n0: from 20 s half of n0, held for the starving gang from 100 s,
    is free. x (an hour long) evicts `d` on n1, room planned around the hold. Once `d` is gone, x must start
    in that room: packing it onto n0's fuller node instead (untracked as backfill) ran past the gang's start,
    the gang did not fit when due, lost its hold and planned its drain over (Philly: 32-GPU gangs waited 75 h)."""
    from fairgpu.model.queue import PreemptionPolicy

    fair = PreemptionPolicy(fair_share=True)
    queues = QueueTree(
        [QueueSpec("stream"), QueueSpec("training", starvation_after=0), QueueSpec("x", preemption=fair)]
    )
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], queues, load_profile("fairgpu"))
    running = (("a", 0, range(4), 20, 0.0), ("b", 0, range(4, 8), 100, 0.0), ("c", 1, range(2), 1000, 0.0))
    for name, node, slots, duration, start in (*running, ("d", 1, range(2, 8), 1000, 25.0)):
        w = wl(name, "stream", len(slots), duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, slots)], started=start)
    s.submit(wl("gang", "training", 8, 3600))
    s.cycle(0)
    assert list(s.reservations["gang"].fit.nodes) == [0] and s.reservations["gang"].fit.at == 100
    s.remove("a", finished_at=20)
    s.submit(wl("x1", "x", 4, 3600, t=30))
    assert [e.workload for e in s.cycle(30).evictions] == ["d"]  # the least work lost
    s.remove("d")
    assert s.cycle(30).started == ["x1"] and s.status("x1").placements[0].node == 1
    s.remove("b", finished_at=100)
    assert s.cycle(100).started == ["gang"]


def test_a_preemptor_starts_in_the_room_it_made_though_a_starving_gang_that_came_later_counts_on_it():
    """x1 evicts `d` (300 s grace) for room on n1 (x2 waits behind it: x's demand makes x1's share fair). A
    short gang then starves: it would end before x1 is due, so it may plan over x1's room, and does (n1 frees
    first by the running work's ends). When `d` has left, x1 starts in the room it made all the same: holding
    that back for the gang would leave n1 idle and x1 waiting for room its eviction already paid for."""
    from fairgpu.model.queue import NEVER, PreemptionPolicy

    stream = QueueSpec("stream", preemption=PreemptionPolicy(grace_period=300))
    training = QueueSpec("training", starvation_after=0, preemption=NEVER)
    queues = QueueTree([stream, training, QueueSpec("x", preemption=PreemptionPolicy(fair_share=True))])
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], queues, load_profile("fairgpu"))
    for name, node, duration, start in (("b", 0, 5000, 0.0), ("d", 1, 1000, 10.0)):
        w = wl(name, "stream", 8, duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, range(8))], started=start)
    s.submit(wl("x1", "x", 4, 3600, t=20))
    s.submit(wl("x2", "x", 8, 3600, t=20))
    assert [e.workload for e in s.cycle(20).evictions] == ["d"]  # the least work lost
    assert list(s.reservations["x1"].fit.nodes) == [1] and s.reservations["x1"].fit.at == 320
    s.submit(wl("gang", "training", 8, 60, t=30))
    assert s.cycle(30).started == []
    assert list(s.reservations["gang"].fit.nodes) == [1] and s.reservations["gang"].fit.at == 1010
    s.remove("d")
    assert s.cycle(320).started == ["x1"] and s.status("x1").placements[0].node == 1


def soonest_end() -> Profile:
    """fairgpu with borrowed capacity going to the work that ends soonest: queues owed their share hold."""
    prof = load_profile("fairgpu")
    return replace(prof, queue_sort=replace(prof.queue_sort, borrowed="soonest-end"))


def test_a_queue_below_its_share_holds_what_a_borrower_frees_without_waiting_to_starve():
    """b (default starvation_after, 10 min) is owed its half while a borrows the whole cluster: GPUs a frees
    go to b's 2-GPU pod when the first node has two free (110 s), not to a's next 1,000 s job one by one until
    b starves. a still starts on the node b does not hold (105 s): borrowing stays work-conserving."""
    queues = QueueTree([QueueSpec("a"), QueueSpec("b")])
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], queues, soonest_end())
    ends = {0: [100, 110, *[5000] * 6], 1: [105, *[5000] * 7]}
    for node, durations in ends.items():
        for slot, d in enumerate(durations):
            w = wl(f"a{node}-{slot}", "a", 1, d)
            s.adopt(w, [s.state.placement_for(w.pods[0], node, [slot])], started=0.0)
    for i in range(4):
        s.submit(wl(f"next{i}", "a", 1, 1000, t=i))
    s.submit(wl("b", "b", 2, 1000, t=0))
    s.cycle(0)
    starts = {}
    for t, node, slot in ((100, 0, 0), (105, 1, 0), (110, 0, 1)):
        s.remove(f"a{node}-{slot}", finished_at=t)
        starts.update({name: (t, s.status(name).placements[0].node) for name in s.cycle(t).started})
    assert starts == {"next0": (105, 1), "b": (110, 0)}


def test_an_owed_hold_is_planned_once_a_cycle_and_not_again_while_nothing_changed(monkeypatch):
    """A plan copies the cluster and lists every running end: one per failed shape of every owed queue made
    the engine 7x slower. a borrows both nodes with work of unknown length, so b's and c's three shapes
    (each within its queue's share) never get a start: each (queue, shape) is planned once, one a cycle,
    then not again until the cluster changes; a GPU freeing plans anew."""
    import fairgpu.framework.starving as starving_module

    plans = []
    real = starving_module.replay
    monkeypatch.setattr(starving_module, "replay", lambda *a, **k: plans.append(1) or real(*a, **k))
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], QueueTree([QueueSpec(q) for q in "abc"]), soonest_end())
    for node in (0, 1):
        for slot in range(8):
            w = Workload(f"a{node}-{slot}", "a", (whole(1),))  # no duration: never counted as ending
            s.adopt(w, [s.state.placement_for(w.pods[0], node, [slot])], started=0.0)
    for name, queue, gpus in (("b1", "b", 1), ("b3", "b", 3), ("c2", "c", 2)):
        s.submit(Workload(name, queue, (whole(gpus),)))
    per_cycle = []
    for t in range(5):
        plans.clear()
        s.cycle(float(t))
        per_cycle.append(len(plans))
    assert per_cycle == [1, 1, 1, 0, 0] and not s.reservations
    s.remove("a0-0")  # the cluster changed: a plan may now find a start (b1 starts at once instead)
    plans.clear()
    assert s.cycle(5.0).started == ["b1"] and len(plans) == 1


def test_a_queue_within_its_share_holds_nothing_while_nobody_borrows_until_it_starves():
    """b holds exactly its half (4 GPUs on each node, n0's ending first), a's 6-GPU job fits a's share but
    no node: nobody borrows, so nothing is owed and a holds no node (it would keep b's next work off n0 for
    nothing) until it has waited its starvation_after; then it holds n0, which frees first."""
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], QueueTree([QueueSpec("a"), QueueSpec("b")]), soonest_end())
    for node, duration in ((0, 1000), (1, 2000)):
        w = wl(f"b{node}", "b", 4, duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, range(4))], started=0.0)
    s.submit(wl("a", "a", 6, 1000, t=0))
    assert s.cycle(0).started == [] and not s.reservations
    assert s.cycle(599).started == [] and not s.reservations
    s.cycle(600)
    assert [(r.workload, list(r.fit.nodes), r.fit.at) for r in s.reservations.values()] == [("a", [0], 1000)]


def gpus_only(gpus: float) -> np.ndarray:
    """A guarantee of this many GPUs, the other dimensions unconstrained."""
    v = np.full(len(r.FAIR_DIMS), np.inf)
    v[r.DIM_GPU] = gpus
    return v


@pytest.mark.parametrize(
    ("policy", "guaranteed", "holds"),
    [
        (PreemptionPolicy(), 0, True),  # reclaims a guarantee, and has none: only a hold gets it its share
        (PreemptionPolicy(fair_share=True), 0, False),  # evicts for its fair share instead
        (PreemptionPolicy(), 2, False),  # the job is within its guarantee, which it reclaims by eviction
    ],
)
def test_a_queue_that_takes_its_share_back_by_eviction_does_not_hold_what_a_borrower_frees(policy, guaranteed, holds):
    """a borrows the whole cluster with work too young to evict (min_runtime), b is owed a 2-GPU job. A
    queue whose policy evicts for its fair share, or work within a guarantee its queue reclaims, takes it
    back by eviction (its preemptors hold the room they make), so it holds nothing here; otherwise b holds
    n0, whose GPUs free first."""
    a = QueueSpec("a", preemption=PreemptionPolicy(min_runtime=10_000))
    b = QueueSpec("b", guaranteed=gpus_only(guaranteed), preemption=policy)
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], QueueTree([a, b]), soonest_end())
    for node, duration in ((0, 100), (1, 200)):
        w = wl(f"a{node}", "a", 8, duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, range(8))], started=0.0)
    s.submit(wl("b", "b", 2, 1000, t=0))
    result = s.cycle(0)
    assert result.started == [] and result.evictions == []
    held = [(r.workload, list(r.fit.nodes), r.fit.at) for r in s.reservations.values()]
    assert held == ([("b", [0], 100)] if holds else [])


@pytest.mark.parametrize(("gpus", "holds"), [(4, True), (6, False)])
def test_only_work_that_fits_its_queues_share_is_owed_a_hold(gpus, holds):
    """a borrows (12 of 16 GPUs), b runs 4 of its 8. b's 4-GPU job fills its share exactly, so it holds n0
    (which frees first); a 6-GPU one would take b above its share: it is not owed, and holds nothing until
    it starves."""
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], QueueTree([QueueSpec("a"), QueueSpec("b")]), soonest_end())
    for name, node, slots, duration in (
        ("a0", 0, range(8), 100),
        ("a1", 1, range(4), 200),
        ("b1", 1, range(4, 8), 5000),
    ):
        w = wl(name, name[0], len(slots), duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, slots)], started=0.0)
    s.submit(wl("b", "b", gpus, 1000, t=0))
    assert s.cycle(0).started == []
    held = [(r.workload, list(r.fit.nodes), r.fit.at) for r in s.reservations.values()]
    assert held == ([("b", [0], 100)] if holds else [])
