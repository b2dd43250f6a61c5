"""Tests added for mutants of framework/ that bench/mutate.py found surviving on main f0b25c5, or whose fast
tests all passed (`git show a748550:docs/testing.md`, "Session 7"): each pins a behaviour that no fast test checked."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import fraction, gpu_node, whole
from fairgpu.catalog import load_profile
from fairgpu.framework.reconfigure import successor
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import PodSpec, QueueSpec, QueueTree, Workload
from fairgpu.spec import format_duration
from test_survivors import backfill_overran_a_gangs_hold

# -- framework/accounting.py: decayed past usage ------------------------------------------------------------------


def _holding_half(half_life: float, start: float) -> Scheduler:
    """Queue a holds 4 of n0's 8 GPUs from `start` on."""
    s = Scheduler([gpu_node("n0")], QueueTree([QueueSpec("a", usage_half_life=half_life)]), load_profile("fairgpu"))
    s.submit(Workload("run", "a", (whole(4),), submit_time=start))
    s.cycle(start)
    assert "run" in s.running
    return s


def _past_usage(s: Scheduler, now: float) -> str:
    """What `fairgpu explain` says of queue a's share with its past usage and of its share ratio, for a 1-GPU
    job submitted now."""
    s.submit(Workload(f"new{now}", "a", (whole(1),), submit_time=now))
    reason = s.explain(f"new{now}", now).reasons[0]
    return reason[reason.index("(with past usage") :]


@pytest.mark.parametrize(("half_life", "start"), [(1.0, 0.0), (3600.0, 1000.0), (0.25, 50.0)])
def test_past_usage_grows_by_half_the_share_held_over_one_half_life_whatever_its_length_or_start(half_life, start):
    """Holding 50 % for one half-life adds 25 % of past usage; for two, 37.5 %. A half-life of a second (or a
    quarter of one) counts as one of an hour, and the clock starts at the first cycle, not at t = 0."""
    s = _holding_half(half_life, start)
    assert _past_usage(s, start + half_life) == "(with past usage 75.0%) against an entitlement of 62.5% (ratio 1.20)"
    then = _past_usage(s, start + 2 * half_life)  # one more job: 6 GPUs of demand
    assert then == "(with past usage 87.5%) against an entitlement of 75.0% (ratio 1.17)"


def test_a_queue_given_a_half_life_starts_from_no_past_usage():
    """Without a half-life only current usage counts, and nothing builds up behind it: a reconfiguration
    that gives queue a a half-life of one minute after an hour at 50 % starts its past usage from zero."""
    s = _holding_half(0.0, 0.0)
    for t in (600.0, 1200.0, 3600.0):
        s.cycle(t)
    assert _past_usage(s, 3600.0) == "(with past usage 50.0%) against an entitlement of 62.5% (ratio 0.80)"
    new = successor(s, [gpu_node("n0")], QueueTree([QueueSpec("a", usage_half_life=60.0)]), 3600.0)
    new.adopt(Workload("run", "a", (whole(4),)), [s.running["run"].placed[0]], started=0.0)
    assert _past_usage(new, 3600.0) == "(with past usage 50.0%) against an entitlement of 62.5% (ratio 0.80)"
    assert _past_usage(new, 3660.0) == "(with past usage 75.0%) against an entitlement of 75.0% (ratio 1.00)"


def test_past_usage_beside_a_queue_without_a_half_life_is_computed_without_a_numpy_warning():
    """Queue a decays its past usage, queue b (no half-life) counts only current usage. Cycles over an hour
    raise no RuntimeWarning (a 0/0 for b's rate, discarded by np.where, would still print one to the
    controller's log, or stop the cycle under `-W error`), and a's past usage is as without b's queue."""
    import warnings

    queues = QueueTree([QueueSpec("a", usage_half_life=3600.0), QueueSpec("b")])
    s = Scheduler([gpu_node("n0")], queues, load_profile("fairgpu"))
    s.submit(Workload("run", "a", (whole(4),)))
    s.submit(Workload("other", "b", (whole(2),)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in (0.0, 600.0, 3600.0):
            s.cycle(t)
        assert _past_usage(s, 3600.0) == "(with past usage 75.0%) against an entitlement of 62.5% (ratio 1.20)"


def test_workloads_are_listed_in_the_order_they_came_adopted_ones_first_then_those_submitted_after():
    """After a restart the engine adopts what runs (first, then second) and then takes a new submission:
    `workloads()` (the dashboard's and CLI's list) gives them in that order, not pending ones first."""
    s = Scheduler([gpu_node("n0", gpus=2)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    for i, name in enumerate(("first", "second")):
        w = Workload(name, "q", (whole(1),))
        s.adopt(w, [s.state.placement_for(w.pods[0], 0, (i,))], started=0.0)
    s.submit(Workload("third", "q", (whole(1),), submit_time=5))
    assert [w.name for w in s.workloads()] == ["first", "second", "third"]


# -- framework/interfaces.py: EngineView.add_usage, each start's share before the next pick ----------------------------


def test_within_a_cycle_a_start_raises_a_queues_share_on_top_of_its_past_usage_before_the_next_pick():
    """Queue a held 2 of 6 GPUs for one half-life (past usage 1/6), b nothing. Room for three of a1, a2, b1,
    b2 (2 GPUs each): b1 first (a's past usage), then a1 (a's ratio 1/3 below b's 2/3), then b2, as a's
    ratio is now its usage and past usage together (1.0), not its usage less its past usage (1/3)."""
    queues = QueueTree([QueueSpec("a", usage_half_life=3600.0), QueueSpec("b")])
    s = Scheduler([gpu_node("n0", gpus=6)], queues, load_profile("fairgpu"))
    s.submit(Workload("old", "a", (whole(2),)))
    for t in (0.0, 3600.0):
        s.cycle(t)
    s.remove("old")
    for name in ("a1", "a2", "b1", "b2"):
        s.submit(Workload(name, name[0], (whole(2),), submit_time=3600.0))
    assert s.cycle(3600.0).started == ["b1", "a1", "b2"]


def test_in_a_one_gpu_cluster_a_fractional_start_counts_its_gpu_share_before_the_next_pick():
    """One GPU, shared in fractions. b runs CPU work (a quarter of the CPUs), a nothing. a1, a2 and b1 want
    40 % of the GPU each: a1 goes first, then b1, as a1 raised a's share to 40 % of the one GPU (ratio 0.67,
    above b's 0.63), not to its 10 % of GPU memory. No room is left for a2."""
    s = Scheduler([gpu_node("n0", gpus=1)], QueueTree([QueueSpec("a"), QueueSpec("b")]), load_profile("fairgpu"))
    s.submit(Workload("cpu", "b", (PodSpec(cpu_m=32000, memory_mib=1024),)))
    s.cycle(0)
    for name, t in (("a1", 1), ("a2", 2), ("b1", 3)):
        s.submit(Workload(name, name[0], (fraction(40, 8192),), submit_time=t))
    assert s.cycle(10).started == ["a1", "b1"]


# -- framework/durations.py, status.py, profile.py ------------------------------------------------------------------


def test_a_queues_run_time_estimate_counts_sub_second_runs_as_they_are_and_a_negative_one_as_zero():
    """Eight runs of 0.5 s and one of -2 s (a clock that stepped back): the 90th percentile of (0.5 × 8, 0)
    is 0.5 s, and the estimate 1.25 times that."""
    from fairgpu.framework.durations import Durations

    d = Durations(1)
    for ran in (0.5,) * 7 + (-2.0,):
        assert d.learned(0) is None
        d.finished(0, ran)
    assert d.learned(0) == pytest.approx(0.625)


def test_a_workloads_status_says_running_once_it_started_and_pending_before():
    s = Scheduler([gpu_node("n0", gpus=2)], QueueTree([QueueSpec("a")]), load_profile("fairgpu"))
    s.submit(Workload("run", "a", (whole(2),)))
    s.submit(Workload("wait", "a", (whole(1),), submit_time=1))
    s.cycle(2)
    assert (s.status("run").state, s.status("run").started) == ("running", 2)
    assert (s.status("wait").state, s.status("wait").started) == ("pending", None)


def _fairgpu_doc() -> dict:
    from importlib.resources import files

    import yaml

    return yaml.safe_load((files("fairgpu") / "profiles" / "fairgpu.yaml").read_text())


@pytest.mark.parametrize("reserve", [True, None])
def test_a_profile_that_does_not_ask_for_reservations_holds_no_nodes_for_a_starving_gang(reserve):
    """The fairgpu profile holds nodes for a gang that starves (reserve: true); the same profile without the
    key holds none: reservations are off unless asked for."""
    from conftest import job
    from fairgpu.catalog import profile_from_dict

    doc = _fairgpu_doc()
    if reserve is None:
        del doc["reserve"]
    queues = QueueTree([QueueSpec("stream"), QueueSpec("train", starvation_after=0)])
    s = Scheduler([gpu_node("n0", gpus=2), gpu_node("n1", gpus=2)], queues, profile_from_dict(doc))
    for i in range(4):
        s.submit(job(f"s{i}", "stream", whole(1)))
    s.cycle(0)
    s.submit(job("gang", "train", whole(2), pods=2, t=1))
    s.cycle(1)
    assert list(s.reservations) == (["gang"] if reserve else [])


def test_a_score_plugin_named_without_a_weight_counts_with_weight_one():
    """BestFit, named as a bare string, sends a 1-GPU pod to n1, which has one GPU left, rather than to the
    idle n0 (with weight 0 every node would score alike and the first would win)."""
    from fairgpu.catalog import profile_from_dict
    from fairgpu.framework.placement import place_pod

    doc = {"name": "t", "queueSort": "PrioritySort", "filter": ["Resources"], "score": ["BestFit"]}
    profile = profile_from_dict(doc)
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], QueueTree([QueueSpec("q")]), profile)
    s.adopt(Workload("big", "q", (whole(7),)), [s.state.placement_for(whole(7), 1, tuple(range(7)))], started=0.0)
    placed = place_pod(whole(1), s.view, profile)
    assert placed is not None and (placed.node, placed.slots) == (1, (7,))


# -- framework/reconfigure.py ---------------------------------------------------------------------------------------


def test_an_elastic_workload_moves_over_a_reconfiguration_at_the_size_it_had_grown_to():
    """e (2 pods, runs with 1) holds n0's only GPU. n0 is resized to 2 GPUs: e carries over running its one
    pod, as a workload of that one pod, and does not grow into the new GPU; a newcomer takes it."""
    from fairgpu.framework.reconfigure import carry_over

    old = Scheduler([gpu_node("n0", gpus=1)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    old.submit(Workload("e", "q", (whole(1),) * 2, min_pods=1))
    assert old.cycle(0).started == ["e"]
    new = successor(old, [gpu_node("n0", gpus=2)], QueueTree([QueueSpec("q")]), 10.0)
    carried = carry_over(old, new, {})
    assert not carried.displaced and not carried.pinned and not carried.orphaned
    assert len(new.running["e"].workload.pods) == 1 and len(new.running["e"].placed) == 1
    new.submit(Workload("next", "q", (whole(1),), submit_time=10))
    result = new.cycle(10)
    assert [b.workload for b in result.bound] == ["next"] and int(new.state.node_idle_gpus[0]) == 0


# -- framework/idle.py ----------------------------------------------------------------------------------------------


def _idle(s: Scheduler, now: float) -> dict[str, float]:
    """Idle GPUs by cause, the causes with none left out; they add up to the idle GPUs."""
    out = s.idle_gpus(now)
    assert sum(out.values()) == pytest.approx(s.state.total_gpus - s.state.allocated_gpu_equivalents())
    return {k: v for k, v in out.items() if v}


def test_a_cluster_with_every_gpu_busy_has_no_idle_gpu_of_any_cause():
    s = Scheduler([gpu_node("n0", gpus=2)], QueueTree([QueueSpec("a")]), load_profile("fairgpu"))
    s.submit(Workload("all", "a", (whole(2),)))
    s.submit(Workload("waits", "a", (whole(1),), submit_time=1))
    s.cycle(1)
    assert _idle(s, 1) == {}
    assert set(s.idle_gpus(1).values()) == {0.0}


@pytest.mark.parametrize(("profile", "pods"), [("fairgpu", 1), ("kube-default", 2)])
def test_idle_gpus_an_admitted_pod_would_fit_are_other_not_gang_for_a_single_pod_or_without_gangs(profile, pods):
    """Pending work that fits, submitted after the cycle: a 1-pod workload under a gang profile, or a 2-pod one
    under a profile without gangs, is no gang waiting for members: its GPUs are idle for `other`."""
    s = Scheduler([gpu_node("n0", gpus=4)], QueueTree([QueueSpec("a")]), load_profile(profile))
    s.cycle(0)
    s.submit(Workload("later", "a", (whole(1),) * pods, submit_time=1))
    assert _idle(s, 1) == {"other": 4}


def test_a_gpu_held_for_a_gang_is_idle_for_the_reservation_up_to_and_at_its_start_not_after():
    """The gang holds both nodes from t=60, when the stream's jobs end; s0 ends early, at 30. Its GPU is
    reserved until 60 inclusive; past 60 (no cycle since) the reservation no longer counts, and the GPU, one
    of a node the gang's 2-GPU pods want, is fragmented."""
    from conftest import starving_gang_beside_a_stream

    s = starving_gang_beside_a_stream()
    assert s.reservations["gang"].fit.at == 60
    s.remove("s0", finished_at=30)
    assert [_idle(s, t) for t in (30, 60, 61)] == [{"reserved": 1}, {"reserved": 1}, {"fragmented": 1}]


def test_a_gang_its_queues_limit_refuses_leaves_gpus_idle_for_the_limit_not_for_the_gang():
    """Queue b may hold 1 GPU and holds it; its 2-pod gang would fit on the 3 free GPUs, pod by pod, but the
    limit refuses it: those GPUs are idle because of the limit (a gang waits for room, this one for quota)."""
    import numpy as np

    from fairgpu import resources as r

    limit = np.full(len(r.FAIR_DIMS), np.inf)
    limit[r.DIM_GPU] = 1
    s = Scheduler([gpu_node("n0", gpus=4)], QueueTree([QueueSpec("b", limit=limit)]), load_profile("fairgpu"))
    s.submit(Workload("first", "b", (whole(1),)))
    s.submit(Workload("gang", "b", (whole(1),) * 2, submit_time=1))
    s.cycle(1)
    assert list(s.pending) == ["gang"]
    assert _idle(s, 1) == {"limit": 3}


def test_gpus_a_pending_pod_wants_exactly_all_of_are_fragmented_when_one_is_busy():
    """n0's 2 GPUs are exactly what the pending pod asks (both, with all their memory); one is busy: the other
    is idle because the pod cannot use a part of what it wants, not because nothing could use it."""
    from fairgpu.model import GpuRequest, PodSpec

    s = Scheduler([gpu_node("n0", gpus=2)], QueueTree([QueueSpec("a")]), load_profile("fairgpu"))
    s.submit(Workload("one", "a", (whole(1),)))
    s.submit(
        Workload("both", "a", (PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(2, 100, 81920)),), submit_time=1)
    )
    s.cycle(1)
    assert list(s.pending) == ["both"]
    assert _idle(s, 1) == {"fragmented": 1}


@pytest.mark.parametrize("exhausted", ["cpu_m", "memory_mib"])
def test_free_gpus_on_a_node_with_no_cpu_or_memory_left_at_all_are_idle_for_cpu_memory(exhausted):
    """n0's CPU (or memory) is booked to the last unit, its GPUs are free: a pending GPU pod's GPUs would fit
    there, its CPU or memory does not."""
    from fairgpu.model import PodSpec

    node = gpu_node("n0", gpus=2, cpu_m=4000, memory_mib=8192)
    s = Scheduler([node], QueueTree([QueueSpec("a")]), load_profile("fairgpu"))
    hog = {"cpu_m": 1000, "memory_mib": 1024} | {exhausted: {"cpu_m": 4000, "memory_mib": 8192}[exhausted]}
    s.submit(Workload("hog", "a", (PodSpec(**hog),)))
    s.submit(Workload("gpu", "a", (whole(1),), submit_time=1))
    s.cycle(1)
    assert list(s.pending) == ["gpu"]
    assert _idle(s, 1) == {"cpu_memory": 2}


# -- framework/explain.py -------------------------------------------------------------------------------------------


def test_the_cluster_position_is_given_for_ten_thousand_ahead_and_none_past_that():
    """docs/dashboard.md: `position_in_cluster` is null past 10,000 ahead; the CLI prints ">10000"."""
    s = Scheduler([gpu_node("n0", gpus=1)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    s.submit(Workload("run", "q", (whole(1),)))
    s.cycle(0)
    for i in range(10_001):
        s.submit(Workload(f"w{i}", "q", (whole(1),), submit_time=1 + i))
    last, past = s.explain("w9999", 20_000), s.explain("w10000", 20_000)
    assert (last.position_in_cluster, past.position_in_cluster) == (10_000, None)
    assert "position in cluster order: 10000 of 10001" in last.lines()
    assert "position in cluster order: >10000 of 10001" in past.lines()


def test_a_running_workload_is_explained_with_no_place_in_any_order():
    s = Scheduler([gpu_node("n0", gpus=1)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    s.submit(Workload("run", "q", (whole(1),)))
    s.cycle(0)
    s.submit(Workload("wait", "q", (whole(1),), submit_time=1))
    got = s.explain("run", 1).to_json()
    assert (got["state"], got["started"], got["reasons"]) == ("running", 0.0, [])
    assert [got[k] for k in ("position_in_queue", "queue_pending", "position_in_cluster", "cluster_pending")] == [
        None,
        0,
        None,
        0,
    ]


def test_a_workload_that_fits_once_the_reservation_it_would_avoid_has_lapsed_is_not_told_of_it():
    """The gang's hold on both nodes starts at t=60; at t=61 it has lapsed (the gang did not start). A 1-GPU
    job that fits in s0's freed GPU is told it waits for its queue's turn, not that the nodes are held; at
    t=30, with the hold still ahead, it is told of the hold."""
    from conftest import job, starving_gang_beside_a_stream

    s = starving_gang_beside_a_stream()
    s.remove("s0", finished_at=30)
    s.submit(job("late", "stream", whole(1), t=30))
    assert s.explain("late", 30).reasons == ["reserved for another workload: nodes held for gang until t=1m"]
    assert s.explain("late", 61).reasons[0].startswith("fair share: waiting for its turn")


def test_a_workload_its_quota_refuses_is_told_that_alone_not_also_of_nodes_held_for_others():
    """Queue stream may hold 3 GPUs and holds them, one GPU is free; the gang holds both nodes from t=60. A
    1-GPU stream job is refused by the quota: that is its reason, though it would also meet the hold."""
    import numpy as np

    from conftest import job
    from fairgpu import resources as r

    limit = np.full(len(r.FAIR_DIMS), np.inf)
    limit[r.DIM_GPU] = 3
    queues = QueueTree([QueueSpec("stream", limit=limit), QueueSpec("train", starvation_after=0)])
    s = Scheduler([gpu_node("n0", gpus=2), gpu_node("n1", gpus=2)], queues, load_profile("fairgpu"))
    for i in range(3):
        s.submit(job(f"s{i}", "stream", whole(1)))
    s.cycle(0)
    s.submit(job("gang", "train", whole(2), pods=2, t=1))
    s.cycle(1)
    assert s.reservations["gang"].fit.at == 60 and int(s.state.node_idle_gpus.sum()) == 1
    s.submit(job("late", "stream", whole(1), t=2))
    reasons = s.explain("late", 2).reasons
    assert len(reasons) == 1 and reasons[0].startswith("quota: ")


def test_a_waiting_pod_is_told_its_place_in_its_queue_at_once_one_being_next():
    """What the live reporter tells each waiting pod before its full explanation (explain.queue_places): a has
    two waiting, the older first; b one; a running workload has no place."""
    from fairgpu.framework.explain import queue_places

    s = Scheduler([gpu_node("n0", gpus=1)], QueueTree([QueueSpec("a"), QueueSpec("b")]), load_profile("fairgpu"))
    s.submit(Workload("run", "a", (whole(1),)))
    s.cycle(0)
    for t, (name, queue) in enumerate([("a1", "a"), ("b1", "b"), ("a2", "a")], 1):
        s.submit(Workload(name, queue, (whole(1),), submit_time=t))
    assert queue_places(s) == {"a1": ("a", 1, 2), "a2": ("a", 2, 2), "b1": ("b", 1, 1)}


# -- framework/backlog.py: a queue fair among its users, in the cycle ------------------------------------------------


def _lab(running: list[tuple[str, str]]) -> Scheduler:
    """n0 has 2 GPUs; queue x holds one; lab (fair among its users) runs `running` (name, user), 1 GPU each."""
    queues = QueueTree([QueueSpec("lab", fair_within="users"), QueueSpec("x")])
    s = Scheduler([gpu_node("n0", gpus=2 + len(running))], queues, load_profile("fairgpu"))
    s.submit(Workload("xx", "x", (whole(1),)))
    for name, user in running:
        s.submit(Workload(name, "lab", (whole(1),), user=user))
    s.cycle(0)
    assert sorted(s.running) == sorted(["xx", *(n for n, _ in running)])
    return s


def test_in_a_queue_fair_among_users_the_one_free_gpu_goes_to_the_user_holding_nothing():
    """alice holds 1 GPU, bob nothing; of their two waiting jobs, alice's is older. One GPU is free: bob's
    job takes it."""
    s = _lab([("a0", "alice")])
    s.submit(Workload("a1", "lab", (whole(1),), submit_time=1, user="alice"))
    s.submit(Workload("b1", "lab", (whole(1),), submit_time=2, user="bob"))
    assert s.cycle(2).started == ["b1"]


def test_in_a_queue_fair_among_users_the_user_holding_less_of_the_cluster_goes_first_not_the_one_with_more_jobs():
    """alice runs one 4-GPU job (half of n0), bob two 1-GPU jobs (a quarter). Of their 2-GPU jobs waiting,
    alice's older, one fits: bob's, as he holds less, though he runs more (and smaller) jobs."""
    s = Scheduler([gpu_node("n0")], QueueTree([QueueSpec("lab", fair_within="users")]), load_profile("fairgpu"))
    for name, user, gpus in (("a0", "alice", 4), ("b0", "bob", 1), ("b1", "bob", 1)):
        s.submit(Workload(name, "lab", (whole(gpus),), user=user))
    assert len(s.cycle(0).started) == 3
    s.submit(Workload("a2", "lab", (whole(2),), submit_time=1, user="alice"))
    s.submit(Workload("b2", "lab", (whole(2),), submit_time=2, user="bob"))
    assert s.cycle(2).started == ["b2"]


def test_in_a_queue_fair_among_users_a_user_whose_work_ended_holds_nothing_again():
    """alice's job ended: she holds nothing, as bob, who never ran anything; of their waiting jobs the older,
    alice's, takes the one free GPU."""
    s = _lab([("a0", "alice")])
    s.remove("a0", finished_at=1)
    s.submit(Workload("hold", "x", (whole(1),), submit_time=1))
    s.cycle(1)
    assert "hold" in s.running
    s.submit(Workload("a1", "lab", (whole(1),), submit_time=2, user="alice"))
    s.submit(Workload("b1", "lab", (whole(1),), submit_time=3, user="bob"))
    assert s.cycle(3).started == ["a1"]


@pytest.mark.parametrize(("profile", "fair_within"), [("fairgpu", None), ("kube-default", "users")])
def test_a_queue_is_fair_among_its_users_only_when_it_says_so_and_its_profile_honours_it(profile, fair_within):
    """alice holds 1 GPU, bob nothing; alice's waiting job is older. In a queue not fair among its users, or
    under a profile that orders each queue strictly by priority and age (kube-default), alice's job takes the
    one free GPU."""
    kw = {} if fair_within is None else {"fair_within": fair_within}
    queues = QueueTree([QueueSpec("lab", **kw), QueueSpec("x")])
    s = Scheduler([gpu_node("n0", gpus=3)], queues, load_profile(profile))
    s.submit(Workload("xx", "x", (whole(1),)))
    s.submit(Workload("a0", "lab", (whole(1),), user="alice"))
    s.cycle(0)
    s.submit(Workload("a1", "lab", (whole(1),), submit_time=1, user="alice"))
    s.submit(Workload("b1", "lab", (whole(1),), submit_time=2, user="bob"))
    assert s.cycle(2).started == ["a1"]


# -- framework/engine.py: the bounded backfill scan ------------------------------------------------------------------


@pytest.mark.parametrize(("longs", "short_starts"), [(100, True), (101, False)])
def test_a_cycle_scans_a_hundred_workloads_for_backfill_behind_one_that_did_not_fit_then_stops(longs, short_starts):
    """Both nodes are held for the starving gang from t=60; s0 left early, so one held GPU is free for work
    that ends before 60. The stream queue's long jobs (1000 s) cannot backfill; the first fails, and the
    cycle skips up to 100 more of that shape (Slurm's bounded backfill test). A short job (10 s) behind 99 of
    them is still tried, and backfills; behind 100, the scan stopped before it (it waits for a later cycle)."""
    from conftest import starving_gang_beside_a_stream

    s = starving_gang_beside_a_stream()
    s.remove("s0", finished_at=5)
    for i in range(longs):
        s.submit(Workload(f"long{i}", "stream", (whole(1),), submit_time=5, duration=1000))
    s.submit(Workload("short", "stream", (whole(1),), submit_time=5, duration=10))
    assert s.cycle(5).started == (["short"] if short_starts else [])


# -- framework/lookahead.py: the estimated start `fairgpu explain` gives ---------------------------------------------


def _running(pod, duration: float, gpus: int = 2) -> Scheduler:
    s = Scheduler([gpu_node("n0", gpus=gpus)], QueueTree([QueueSpec("a")]), load_profile("fairgpu"))
    s.submit(Workload("run", "a", (pod,), duration=duration))
    s.cycle(0)
    assert "run" in s.running
    return s


@pytest.mark.parametrize(("ahead", "expected"), [(50.0, 150.0), (None, None)])
def test_the_estimated_start_waits_for_what_runs_and_for_what_goes_ahead_to_end(ahead, expected):
    """run holds both GPUs until t=100; w1, ahead of w2 and as wide, runs 50 s after it: w2 would start at
    150. With w1's length unknown, w2's start is unknown too (w1 itself would start at 100)."""
    s = _running(whole(2), 100)
    s.submit(Workload("w1", "a", (whole(2),), submit_time=1, duration=ahead))
    s.submit(Workload("w2", "a", (whole(2),), submit_time=2))
    assert (s.explain("w1", 10).estimated_start, s.explain("w2", 10).estimated_start) == (100, expected)


def test_the_estimated_start_of_a_share_of_a_busy_gpu_that_fits_now_is_now():
    """half holds 50 cores of the only GPU (no GPU is wholly idle) until t=100; a CPU-only job and then a 30-core
    share wait: both fit now, and are told so."""
    from conftest import fraction
    from fairgpu.model import PodSpec

    s = _running(fraction(50, 1000), 100, gpus=1)
    s.submit(Workload("cpu", "a", (PodSpec(cpu_m=1000, memory_mib=1024),), submit_time=1))
    s.submit(Workload("share", "a", (fraction(30, 1000),), submit_time=2))
    assert [s.explain(n, 10).estimated_start for n in ("cpu", "share")] == [10, 10]


def test_the_estimated_start_of_a_cores_100_pod_beside_another_on_a_200_core_card_is_now():
    """On a card of 200 cores (HAMi deviceCoreScaling 2) a cores-100 pod takes half: with one running there until
    t=100 and no card idle, a second fits now, and is told so (once told t=100, as if it needed an idle card)."""
    from fairgpu.model import GpuDevice, GpuRequest, NodeSpec

    node = NodeSpec("n0", 64_000, 1 << 18, (GpuDevice("A100-80GB", 81920, uuid="GPU-n0-0", cores=200),))
    s = Scheduler([node], QueueTree([QueueSpec("a")]), load_profile("fairgpu"))
    half = PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, 100, 4096))
    s.submit(Workload("run", "a", (half,), duration=100))
    s.cycle(0)
    s.submit(Workload("half", "a", (half,), submit_time=1))
    assert s.state.node_idle_gpus[0] == 0 and s.explain("half", 10).estimated_start == 10


def test_a_cores_100_pod_that_a_200_core_card_lacks_gpu_memory_for_fails_for_memory_not_fragmentation():
    """The fill's failure breakdown: a 200-core card with a 50-core task keeps 150 cores, room for a cores-100
    pod (HAMi shares such a card), so a pod asking more GPU memory than is left fails for GPU memory, not for
    want of an idle card ("fragmentation", as it once said)."""
    from fairgpu.framework.placement import unplaced_cause
    from fairgpu.model import GpuDevice, GpuRequest, NodeSpec
    from fairgpu.state import ClusterState

    st = ClusterState([NodeSpec("n0", 64_000, 1 << 18, (GpuDevice("T4", 16384, uuid="GPU-n0-0", cores=200),))])
    share = PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, 50, 12000))
    st.assign("share", st.placement_for(share, 0, (0,)))
    big = PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, 100, 8000))
    assert unplaced_cause(big, st) == "GPU memory or task limit"


def test_work_that_would_end_together_is_freed_in_the_order_it_was_planned_for_the_estimated_start():
    """r holds both nodes until t=5. Then a (4 GPUs) takes n0 and b (2 GPUs) n1, both for 10 s: they end
    together at 15. a's n0 is freed first, so c (2 GPUs, 100 s) goes there, and d, which needs a whole
    4-GPU node, waits for c: t=115. Freed b first, c would take n1 and d start at 15. CPU jobs queued before
    and between them (a is the 3rd to replay, b the 11th) change nothing."""
    s = Scheduler(
        [gpu_node("n0", gpus=4), gpu_node("n1", gpus=2)], QueueTree([QueueSpec("q")]), load_profile("fairgpu")
    )
    r = Workload("r", "q", (whole(4), whole(2)), duration=5.0)
    s.adopt(r, [s.state.placement_for(whole(4), 0, (0, 1, 2, 3)), s.state.placement_for(whole(2), 1, (0, 1))], 0.0)
    cpu = PodSpec(cpu_m=100, memory_mib=64)
    order = [*"xx", "a", *"xxxxxxx", "b", "c", "d"]
    for i, name in enumerate(order):
        gpus, duration = {"a": (4, 10.0), "b": (2, 10.0), "c": (2, 100.0), "d": (4, 10.0)}.get(name, (0, None))
        pod = whole(gpus) if gpus else cpu
        s.submit(Workload(name if gpus else f"x{i}", "q", (pod,), submit_time=1.0 + i, duration=duration))
    assert [s.explain(n, 4).estimated_start for n in "abcd"] == [5, 5, 15, 115]


# -- framework/preempting.py ----------------------------------------------------------------------------------------


def test_preemptors_whose_victims_are_still_leaving_evict_nobody_else():
    """b evicts its own lower priorities, with a 30 s grace. u1 and u2 (urgent, one GPU each) evict the two
    youngest, low1 and low2, at t=100; at t=110 both are still leaving, and neither preemptor takes low0 too."""
    from fairgpu.model.queue import PreemptionPolicy

    b = QueueSpec("b", preemption=PreemptionPolicy(within_queue="LowerPriority", grace_period=30))
    s = Scheduler([gpu_node("n0", gpus=3)], QueueTree([b]), load_profile("fairgpu"))
    for i in range(3):
        w = Workload(f"low{i}", "b", (whole(1),), duration=36000.0)
        s.adopt(w, [s.state.placement_for(w.pods[0], 0, (i,))], started=float(i))
    for i in (1, 2):
        s.submit(Workload(f"u{i}", "b", (whole(1),), submit_time=100, priority=5, duration=36000.0))
    assert sorted(e.workload for e in s.cycle(100).evictions) == ["low1", "low2"]
    assert s.cycle(110).evictions == []


def test_a_queues_run_time_estimate_follows_its_last_64_runs():
    """64 runs of 1000 s, then 64 of 10 s: the estimate has forgotten the long ones (1.25 × 10 s); one run
    earlier, one long run was still among the last 64, below the 90th percentile."""
    from fairgpu.framework.durations import Durations

    d = Durations(1)
    for ran in (1000.0,) * 64 + (10.0,) * 63:
        d.finished(0, ran)
    assert d.learned(0) == pytest.approx(12.5)
    d = Durations(1)
    for ran in (1000.0,) * 64 + (10.0,) * 6:
        d.finished(0, ran)
    assert d.learned(0) == pytest.approx(1250.0)
    for _ in range(58):
        d.finished(0, 10.0)
    assert d.learned(0) == pytest.approx(12.5)


@pytest.mark.parametrize(("a_holds", "evictions"), [(1, 1), (2, 1), (3, 0)])
def test_a_fair_share_eviction_is_worth_it_for_the_wait_behind_queue_mates_within_the_share(a_holds, evictions):
    """Queue a (entitled to 4 of 8 GPUs) holds `a_holds`; c holds the rest until t=36000, but for one GPU
    freed at 1100. At 1000 a1 then a2 (1 GPU each) wait. a1 alone would wait 100 s: not worth evicting work
    that ran 1000 s. a2 waits behind a1 while a's share has room for both, until 36000: worth one eviction.
    Holding 3, a's share has room for a2 alone: a1 is not counted ahead, and nothing is evicted."""
    from fairgpu.model.queue import PreemptionPolicy

    a = QueueSpec("a", preemption=PreemptionPolicy(reclaim=False, fair_share=True))
    s = Scheduler([gpu_node("n0")], QueueTree([a, QueueSpec("c")]), load_profile("fairgpu"))
    s.submit(Workload("a0", "a", (whole(a_holds),), duration=36000.0))
    s.submit(Workload("c0", "c", (whole(1),), duration=1100.0))
    for i in range(1, 8 - a_holds):
        s.submit(Workload(f"c{i}", "c", (whole(1),), duration=36000.0))
    s.cycle(0)
    assert len(s.running) == 8 - a_holds + 1
    s.submit(Workload("a1", "a", (whole(1, cpu_m=1000),), submit_time=1000, duration=36000.0))
    s.submit(Workload("a2", "a", (whole(1, cpu_m=1001),), submit_time=1000, duration=36000.0))
    result = s.cycle(1000)
    assert len(result.evictions) == evictions
    assert list(s.reservations) == ["a2"] * evictions


@pytest.mark.parametrize(("soon", "evicted"), [(64, ["c0"]), (65, [])])
def test_a_fair_share_preemptors_wait_is_judged_behind_at_most_64_queue_mates(soon, evicted):
    """Queue a (weight 100: its share has room for all its work) has 65 one-GPU jobs waiting, then p. All 72
    GPUs run c's work, `soon` of them free at 1100, the rest at 36000. p's wait behind its queue-mates is
    replayed behind the first 64 only (a bound on the decision's cost): with 64 GPUs freeing soon they take
    them all and p would wait till 36000, worth evicting work that ran 1000 s; with 65, the 65th is p's at
    1100, 100 s away: not worth it, though a 65th queue-mate would have taken it."""
    from fairgpu.model.queue import PreemptionPolicy

    a = QueueSpec("a", weight=100.0, preemption=PreemptionPolicy(reclaim=False, fair_share=True))
    s = Scheduler([gpu_node(f"n{i}") for i in range(9)], QueueTree([a, QueueSpec("c")]), load_profile("fairgpu"))
    for i in range(72):
        w = Workload(f"c{i}", "c", (whole(1),), duration=1100.0 if i < soon else 36000.0)
        s.adopt(w, [s.state.placement_for(w.pods[0], i // 8, (i % 8,))], started=0.0)
    for i in range(65):
        s.submit(Workload(f"m{i}", "a", (whole(1),), submit_time=1000, duration=36000.0))
    s.submit(Workload("p", "a", (whole(1, cpu_m=1001),), submit_time=1000, duration=36000.0))
    assert [e.workload for e in s.cycle(1000).evictions] == evicted


def test_room_made_by_preemption_is_held_from_a_later_workload_of_the_same_queue_that_only_fits():
    """u evicts low0 (30 s grace) at t=100. v, of u's queue and of higher priority, arrives at 105; at 130
    low0 has left and v comes first in order, but the room was made for u: v may not just take it."""
    s = _lower_priorities([gpu_node("n0", gpus=1)], [(Workload("low0", "b", (whole(1),)), [(0, (0,))])], grace=30)
    s.submit(Workload("u", "b", (whole(1),), submit_time=100, priority=5))
    assert [e.workload for e in s.cycle(100).evictions] == ["low0"]
    s.submit(Workload("v", "b", (whole(1),), submit_time=105, priority=10))
    assert s.cycle(105).started == []
    s.remove("low0", finished_at=130)
    assert s.cycle(130).started == ["u"]


def test_after_a_refused_eviction_and_a_start_the_next_preemptor_chooses_among_what_runs_now():
    """u1 evicts low0 at t=100; low0's eviction is refused (until t=300), low1 ends, and u1 starts in its
    place. u2, at 110, evicts low2: neither low0 (refused) nor low1 (gone)."""
    running = [(Workload(f"low{i}", "b", (whole(1),)), [(0, (i,))]) for i in range(3)]
    s = _lower_priorities([gpu_node("n0", gpus=3)], running, grace=30)
    s.submit(Workload("u1", "b", (whole(1),), submit_time=100, priority=5))
    assert [e.workload for e in s.cycle(100).evictions] == ["low0"]
    s.eviction_refused("low0", 300)
    s.remove("low1", finished_at=105)
    assert s.cycle(105).started == ["u1"]
    s.submit(Workload("u2", "b", (whole(1),), submit_time=110, priority=5))
    assert [e.workload for e in s.cycle(110).evictions] == ["low2"]


def test_a_preemptor_whose_eviction_was_refused_chooses_again_among_work_started_since():
    """u1 (3 of n0's 4 GPUs) evicts low0 at t=100; w, 10 s long, backfills a GPU of u1's room meanwhile.
    low0's eviction is refused: at 101 u1 chooses again among what runs now, w included (1 free GPU, low1
    and w make its 3), not among what ran when it first chose (low1 alone is not enough)."""
    running = [(Workload(f"low{i}", "b", (whole(1),)), [(0, (i,))]) for i in range(2)]
    s = _lower_priorities([gpu_node("n0", gpus=4)], running, grace=30)
    s.submit(Workload("u1", "b", (whole(3),), submit_time=100, priority=5))
    s.submit(Workload("w", "b", (whole(1),), submit_time=100, duration=10.0))
    result = s.cycle(100)
    assert [e.workload for e in result.evictions] == ["low0"] and result.started == ["w"]
    s.eviction_refused("low0", 300)
    assert sorted(e.workload for e in s.cycle(101).evictions) == ["low1", "w"]


def test_an_eviction_refused_after_its_preemptor_was_deleted_leaves_the_victim_running_and_eligible():
    """u evicts low0 at t=100 and is deleted before low0 goes; then low0's eviction is refused (a disruption
    budget): the engine takes the refusal (it does not fail on u's missing hold), low0 runs on as before,
    and v, urgent at 300 when the refusal's back-off ends, evicts it."""
    s = _lower_priorities([gpu_node("n0", gpus=1)], [(Workload("low0", "b", (whole(1),)), [(0, (0,))])], grace=30)
    s.submit(Workload("u", "b", (whole(1),), submit_time=100, priority=5))
    assert [e.workload for e in s.cycle(100).evictions] == ["low0"]
    s.remove("u")
    s.eviction_refused("low0", 300)
    assert s.status("low0").state == "running" and not s.status("low0").terminating
    s.submit(Workload("v", "b", (whole(1),), submit_time=300, priority=5))
    assert [e.workload for e in s.cycle(300).evictions] == ["low0"]


def test_a_starving_workload_behind_a_queue_mate_of_its_shape_that_could_not_preempt_takes_the_hold():
    """The gang holds n0 from 1000. At 200 queue q (no preemption) has `urgent` (priority 10, not yet
    starving) and `short` (starving), of one shape; q comes first. urgent fails outside the hold and may
    not preempt; ahead of the gang in the order, it ends the gang's hold. short then fails everywhere, and
    having preempted no more than urgent could, it takes the hold: starving, first in the cycle's order."""
    from fairgpu.model.queue import NEVER

    q = QueueSpec("q", starvation_after=100, preemption=NEVER)
    s = Scheduler(
        [gpu_node("n0"), gpu_node("n1")], QueueTree([q, QueueSpec("t", starvation_after=0)]), load_profile("fairgpu")
    )
    for name, node, end in (("long0", 0, 1000.0), ("long1", 1, 2000.0)):
        w = Workload(name, "t", (whole(8),), duration=end)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, range(8))], started=0.0)
    s.submit(Workload("gang", "t", (whole(8),), duration=3600.0))
    s.cycle(0)
    assert list(s.reservations) == ["gang"]
    s.submit(Workload("short", "q", (whole(8),), submit_time=50, duration=100.0))
    s.submit(Workload("urgent", "q", (whole(8),), submit_time=200, duration=5000.0, priority=10))
    assert s.cycle(200).started == []
    assert list(s.reservations) == ["short"] and s.reservations["short"].fit.at == 1000


@pytest.mark.parametrize("starving", [False, True])
def test_two_preemptors_of_one_queue_never_count_on_the_same_free_gpu(starving):
    """n0: one GPU free, low0-low2 on the others. p1 and p2 (2 GPUs each, urgent) come at once: p1 takes
    the free GPU and evicts low0; p2 may not count on that free GPU again, so it evicts low1 and low2. So
    too when they starve at once: p1 holds the room its eviction makes, not nodes as a starving workload."""
    running = [(Workload(f"low{i}", "b", (whole(1),), duration=1000.0), [(0, (i,))]) for i in range(3)]
    s = _lower_priorities([gpu_node("n0", gpus=4)], running, grace=30, starvation_after=0 if starving else 600)
    for name in ("p1", "p2"):
        s.submit(Workload(name, "b", (whole(2),), submit_time=100, priority=5))
    assert [e.workload for e in s.cycle(100).evictions] == ["low0", "low1", "low2"]


def test_room_a_preemptors_victim_left_stays_its_own_while_its_other_victim_leaves():
    """p1 (2 GPUs, urgent) evicts low0 and low1; low0 has left, low1 not yet. p2, as urgent, comes at 110:
    the room both leave is p1's, so p2 evicts low2 and low3 rather than count on low0's free GPU."""
    running = [(Workload(f"low{i}", "b", (whole(1),)), [(0, (i,))]) for i in range(4)]
    s = _lower_priorities([gpu_node("n0", gpus=4)], running, grace=30)
    s.submit(Workload("p1", "b", (whole(2),), submit_time=100, priority=5))
    assert sorted(e.workload for e in s.cycle(100).evictions) == ["low0", "low1"]
    s.remove("low0", finished_at=105)
    s.submit(Workload("p2", "b", (whole(2),), submit_time=110, priority=5))
    assert sorted(e.workload for e in s.cycle(110).evictions) == ["low2", "low3"]


def test_a_starving_preemptor_ahead_of_a_gang_evicts_outside_the_gangs_hold_when_it_cannot_take_it_over():
    """The gang (queue t) holds n0 from 1000. At 150 E (queue q, fair share, ahead of t in the order) starves
    and fits nowhere, not even on the gang's nodes: the gang keeps its hold, and E evicts v on n2 (r's, as
    old as long0 on the held n0) rather than the work the gang waits for."""
    from fairgpu.model.queue import PreemptionPolicy

    t = QueueSpec("t", starvation_after=0, preemption=PreemptionPolicy(enabled=False, reclaim=False, min_runtime=1000))
    q = QueueSpec("q", starvation_after=0, preemption=PreemptionPolicy(fair_share=True))
    r = QueueSpec("r", preemption=PreemptionPolicy(min_runtime=100))
    s = Scheduler([gpu_node(f"n{i}") for i in range(3)], QueueTree([t, q, r]), load_profile("fairgpu"))

    def adopt(name: str, queue: str, node: int, start: float, end: float) -> None:
        w = Workload(name, queue, (whole(8),), duration=end - start)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, range(8))], started=start)

    for name, node, end in (("long0", 0, 1000.0), ("long1", 1, 2000.0), ("v", 2, 5000.0)):
        adopt(name, "r", node, 0.0, end)
    s.submit(Workload("gang", "t", (whole(8),), duration=3600.0))
    s.cycle(0)
    s.remove("long1", finished_at=100)
    adopt("mid", "t", 1, 100.0, 300.0)  # t now holds more than q: q goes first
    s.submit(Workload("E", "q", (whole(8),), submit_time=150, duration=3600.0))
    assert [e.workload for e in s.cycle(150).evictions] == ["v"]
    assert list(s.reservations["gang"].fit.nodes) == [0] and s.reservations["gang"].fit.at == 1000


def test_a_preemptor_due_to_end_before_another_queues_room_is_due_counts_on_its_free_gpu_as_backfill():
    """n0: one GPU free, r's low0-low6 on the others (30 s grace). Y (queue y) takes the free GPU and evicts
    low0: its room is due at 130. X (queue x, declared to run 0 s, so ending by 130 when it starts at 130)
    may use that room like backfill: it counts on the free GPU too and evicts one more, not two."""
    from fairgpu.model.queue import PreemptionPolicy

    fair = PreemptionPolicy(fair_share=True)
    r = QueueSpec("r", preemption=PreemptionPolicy(grace_period=30))
    s = Scheduler(
        [gpu_node("n0")],
        QueueTree([r, QueueSpec("x", preemption=fair), QueueSpec("y", preemption=fair)]),
        load_profile("fairgpu"),
    )
    for i in range(7):
        w = Workload(f"low{i}", "r", (whole(1),), duration=1000.0)
        s.adopt(w, [s.state.placement_for(w.pods[0], 0, (i,))], started=0.0)
    s.submit(Workload("Y", "y", (whole(2),), submit_time=99, duration=3600.0))
    s.submit(Workload("X", "x", (whole(2),), submit_time=100, duration=0.0))
    evictions = s.cycle(100).evictions
    assert [(e.workload, e.reason) for e in evictions] == [("low0", "preempted for Y"), ("low1", "preempted for X")]


# -- framework/scheduler.py: requests, counts --------------------------------------------------------------------


def test_a_name_is_submitted_once_and_only_an_elastic_workloads_newest_extra_pods_can_be_shrunk():
    from fairgpu.errors import RequestError

    s = Scheduler([gpu_node("n0")], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    s.submit(Workload("w", "q", (whole(1),) * 3, min_pods=2))
    s.submit(Workload("p", "q", (whole(8),)))
    with pytest.raises(RequestError, match="p: already submitted"):
        s.submit(Workload("p", "q", (whole(1),)))  # pending
    s.cycle(0)
    with pytest.raises(RequestError, match="w: already submitted"):
        s.submit(Workload("w", "q", (whole(1),)))  # running
    for pods in [(1,), (0,), (1, 2)]:  # not the newest; nor below min_pods
        with pytest.raises(ValueError, match="only its newest pods above min_pods"):
            s.shrink("w", pods)
    newest = s.running["w"].placed[2]
    assert s.shrink("w", (2,)) == [newest] and len(s.running["w"].placed) == 2


def test_a_queue_is_left_for_the_cycle_once_its_shape_fails_though_a_removed_workload_had_another():
    """x (2 CPUs) was submitted and removed; five 1-GPU jobs wait behind a busy GPU. The first fails and
    cannot preempt: the queue has no other shape waiting, so the cycle makes one attempt, not five (the
    `schedule_attempts` metric, and a long backlog's cost per cycle); a shape gone with x does not count."""
    s = Scheduler([gpu_node("n0", gpus=1)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    busy = Workload("busy", "q", (whole(1),))
    s.adopt(busy, [s.state.placement_for(busy.pods[0], 0, (0,))], started=0.0)
    s.submit(Workload("x", "q", (whole(1, cpu_m=2000),), submit_time=1))
    s.remove("x")
    for i in range(5):
        s.submit(Workload(f"y{i}", "q", (whole(1),), submit_time=2))
    assert s.cycle(10).attempts == 1


def test_a_partly_placed_workload_is_admitted_for_its_missing_pods_only_under_its_queues_limit():
    """A profile with a quota but no gang keeps a workload's pods as they fit. a (limit 2 GPUs) asks for two
    1-GPU pods where b holds one of the two GPUs: the first is placed. Once b's job ends, the second is
    admitted (1 held + 1 asked is within the limit; counting the placed pod twice would refuse it) and a0 starts."""
    from fairgpu.catalog import profile_from_dict
    from test_survivors import _gpus

    profile = profile_from_dict({"name": "t", "queueSort": "FairShare", "admit": ["Quota"], "filter": ["Resources"]})
    s = Scheduler([gpu_node("n0", gpus=2)], QueueTree([QueueSpec("a", limit=_gpus(2)), QueueSpec("b")]), profile)
    s.submit(Workload("b0", "b", (whole(1),)))
    s.cycle(0)
    s.submit(Workload("a0", "a", (whole(1), whole(1)), submit_time=10))
    assert [(b.workload, b.pod) for b in s.cycle(10).bound] == [("a0", 0)]
    s.remove("b0")
    result = s.cycle(20)
    assert [(b.workload, b.pod) for b in result.bound] == [("a0", 1)] and result.started == ["a0"]


def test_the_counts_a_dashboard_shows_pending_running_backlogged_and_attempts_per_queue():
    """a runs one workload (one attempt) and waits with one; b waits with two; c has nothing. A cycle tries a1
    and b0; b1, of the shape that just failed, is not tried again."""
    queues = QueueTree([QueueSpec("a"), QueueSpec("b"), QueueSpec("c")])
    s = Scheduler([gpu_node("n0", gpus=1)], queues, load_profile("fairgpu"))
    s.submit(Workload("a0", "a", (whole(1),)))
    assert s.cycle(0).attempts == 1
    for name, queue in [("a1", "a"), ("b0", "b"), ("b1", "b")]:
        s.submit(Workload(name, queue, (whole(1),), submit_time=1))
    assert s.cycle(1).attempts == 2
    pending, running = s.workload_counts()
    assert (pending.tolist(), running.tolist()) == ([1, 2, 0], [1, 0, 0])
    assert s.is_backlogged().tolist() == [True, True, False]
    # an elastic workload placed at 2 of its 3 pods tries to grow in the same cycle: two attempts
    s = Scheduler([gpu_node("n0", gpus=2)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    s.submit(Workload("e", "q", (whole(1),) * 3, min_pods=1))
    assert s.cycle(0).attempts == 2 and len(s.running["e"].placed) == 2


# -- framework/backfill.py ------------------------------------------------------------------------------------------


def test_backfill_evicted_when_the_reservation_came_due_is_not_evicted_again_while_it_leaves():
    """n0 is held for the gang from t=1000; 'short' backfilled beside it and overran. At 1000 it is evicted
    with a 30 s grace; at 1010, and at 1030 when its grace is over but the cluster has not removed it yet, it
    is still leaving: no second eviction is decided for it, and the gang waits for it, not for a new grace."""
    s = backfill_overran_a_gangs_hold()
    assert [(e.workload, e.at) for e in s.cycle(1000).evictions] == [("short", 1030.0)]
    assert s.cycle(1010).evictions == [] and s.cycle(1030).evictions == []
    assert s.reservations["gang"].fit.at == 1030
    s.cycle(1040)  # nothing else drains there: the hold still dates from 1030, not renewed to now
    assert s.explain("gang", 1040).reasons == [
        "no fit: 0/2 nodes: 2 too few idle GPUs",
        "starving: 1 node(s) reserved for it from t=17m10s",
    ]


def test_a_starving_gang_keeps_its_nodes_for_as_long_as_the_work_it_waits_for_overruns():
    """The gang holds both nodes from t=60, when the stream's jobs were to end; they overrun. Each cycle it
    keeps holding them (its hold renewed to now), not just the first after 60: the drain is not started over."""
    from conftest import starving_gang_beside_a_stream

    s = starving_gang_beside_a_stream()
    for t in (60, 70, 80):
        s.cycle(t)
        assert s.explain("gang", t).reasons[-1] == f"starving: 2 node(s) reserved for it from t={format_duration(t)}"


# -- framework/placement.py: a gang's pods together -----------------------------------------------------------------


@pytest.mark.parametrize("held", [False, True])
def test_a_gangs_pods_stay_on_its_node_without_scores_and_beside_a_node_held_for_another(held):
    """A gang profile with no score plugin puts a pod on the first node that fits, but a gang's later pods on
    the nodes it already took: its 3-GPU pod takes n1 (n0 has 2 GPUs), and its 2-GPU pod joins it there
    rather than take n0. The same with n2 held for another workload (excluded)."""
    from fairgpu.catalog import profile_from_dict
    from fairgpu.framework.placement import place_all

    doc = {"name": "t", "queueSort": "PrioritySort", "filter": ["Resources"], "gang": True, "permit": ["Gang"]}
    nodes = [gpu_node("n0", gpus=2), gpu_node("n1"), gpu_node("n2")]
    s = Scheduler(nodes, QueueTree([QueueSpec("q")]), profile_from_dict(doc))
    exclude = np.array([False, False, True]) if held else None
    placed = place_all([whole(3), whole(2)], ["g0", "g1"], s.view, s.profile, exclude)
    assert [p.node for p in placed] == [1, 1]


# -- framework/victims.py: an elastic workload's extra pod as a victim unit ------------------------------------------


def _lower_priorities(nodes, running, grace: float = 0.0, starvation_after: float = 600.0) -> Scheduler:
    """Queue b, which evicts its own lower-priority work with this grace, running these (workload, placements)
    since t=0."""
    from fairgpu.model.queue import PreemptionPolicy

    policy = PreemptionPolicy(within_queue="LowerPriority", grace_period=grace)
    b = QueueSpec("b", starvation_after=starvation_after, preemption=policy)
    s = Scheduler(nodes, QueueTree([b]), load_profile("fairgpu"))
    for wl, placements in running:
        at = [s.state.placement_for(pod, node, slots) for pod, (node, slots) in zip(wl.pods, placements, strict=True)]
        s.adopt(wl, at, 0.0)
    return s


def test_the_extra_pod_that_loses_least_work_is_evicted_first():
    """e1's and e2's newest (extra) pods are the cheapest victims for u, urgent in the same queue: e1's holds
    2 GPUs, e2's 1, both running for 100 s. Evicting e2's loses less work, and frees the GPU u needs."""
    s = _lower_priorities(
        [gpu_node("n0", gpus=8)],
        [
            (Workload("e1", "b", (whole(1), whole(2)), min_pods=1), [(0, (0,)), (0, (1, 2))]),
            (Workload("e2", "b", (whole(1), whole(1)), min_pods=1), [(0, (3,)), (0, (4,))]),
            (Workload("w", "b", (whole(3),)), [(0, (5, 6, 7))]),
        ],
    )
    s.submit(Workload("u", "b", (whole(1),), submit_time=100, priority=5))
    assert [(e.workload, e.pods) for e in s.cycle(100).evictions] == [("e2", (1,))]


def test_an_extra_pods_gpu_costs_only_the_extra_pod_not_its_whole_workload_too():
    """Two full 4-GPU nodes: w0 (3 GPUs) and e2's extra pod on n0, e2's first pod and w1 (3 GPUs) on n1. u,
    urgent in the same queue, needs one GPU: e2's extra pod on n0 frees it, the cheapest victim there is. The
    extra pod's GPU is held by its whole workload's unit too; counting both made n1 (e2's first pod, its whole
    unit only) look cheaper, and the whole of e2 went, against "extra pods go before any whole workload"."""
    s = _lower_priorities(
        [gpu_node("n0", gpus=4), gpu_node("n1", gpus=4)],
        [
            (Workload("w0", "b", (whole(3),)), [(0, (0, 1, 2))]),
            (Workload("e2", "b", (whole(1), whole(1)), min_pods=1), [(1, (0,)), (0, (3,))]),
            (Workload("w1", "b", (whole(3),)), [(1, (1, 2, 3))]),
        ],
    )
    s.submit(Workload("u", "b", (whole(1),), submit_time=100, priority=5))
    assert [(e.workload, e.pods) for e in s.cycle(100).evictions] == [("e2", (1,))]


def test_an_elastic_workload_evicted_whole_with_its_extra_pod_frees_that_pod_once():
    """Dry runs free what the chosen units hold. e's extra pod (1 GPU, 3 cores) is also in e's whole unit:
    choosing both must free its CPU and GPU once, not twice (a node with more free than it has would make
    room a preemptor does not really get)."""
    s = _lower_priorities(
        [gpu_node("n0", gpus=4)],
        [(Workload("e", "b", (whole(1, cpu_m=2000), whole(1, cpu_m=3000)), min_pods=1), [(0, (0,)), (0, (1,))])],
    )
    table = s.preempting.victims()
    assert table.whole.tolist() == [True, False]
    freed = table.freed(np.array([True, True]))
    assert sorted(freed.pod_cpu.tolist()) == [2000, 3000] and sorted(freed.slot_idx.tolist()) == [0, 1]
    assert table.freed(np.array([False, True])).pod_cpu.tolist() == [3000]


@pytest.mark.parametrize("order", ["wxy", "yxw"])
def test_a_preemptor_holds_every_node_its_victims_leave_not_only_the_one_it_will_use(order):
    """u needs a whole 2-GPU node. w has a pod on each node, so it goes whichever node u takes, with x (on
    n0) or y (on n1): x. u holds both nodes w leaves, so no one else takes the GPU freed on n1, whichever
    order the three were adopted in; from when their 30 s grace ends."""
    running = {
        "x": (Workload("x", "b", (whole(1),)), [(0, (0,))]),
        "w": (Workload("w", "b", (whole(1), whole(1))), [(0, (1,)), (1, (1,))]),
        "y": (Workload("y", "b", (whole(1),)), [(1, (0,))]),
    }
    s = _lower_priorities([gpu_node("n0", gpus=2), gpu_node("n1", gpus=2)], [running[n] for n in order], grace=30)
    s.submit(Workload("u", "b", (whole(2),), submit_time=100, priority=5))
    assert sorted(e.workload for e in s.cycle(100).evictions) == ["w", "x"]
    assert s.explain("u", 100).reasons[-1] == "preempting: 2 node(s) reserved for it from t=2m10s"


# -- framework/interfaces.py: FitMask.counts ------------------------------------------------------------------------


def test_free_gpus_are_counted_right_on_sixteen_gpu_nodes_and_on_eight_four_gpu_nodes():
    """Shares of GPUs (the cards a pod can share are counted per node). Two 16-GPU nodes: a takes 50 cores of
    10 cards; b, 60 cores of 7, finds only 6 such cards beside a, and c (60 cores of 9) fits only beside b.
    On one such node, b waits and c (60 cores of 6) fits. Eight 4-GPU nodes take eight pods asking 60 cores
    of 4 cards, one each, and a ninth waits."""
    from fairgpu.model import GpuRequest

    def share(count: int, cores: int) -> PodSpec:
        return PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(count, cores, 1000))

    s = Scheduler(
        [gpu_node("n0", gpus=16), gpu_node("n1", gpus=16)], QueueTree([QueueSpec("q")]), load_profile("fairgpu")
    )
    for t, (name, count, cores) in enumerate([("a", 10, 50), ("b", 7, 60), ("c", 9, 60)]):
        s.submit(Workload(name, "q", (share(count, cores),), submit_time=t))
        s.cycle(t)
    node = {n: s.running[n].placed[0].node for n in "abc"}
    assert node["a"] != node["b"] == node["c"]
    s = Scheduler([gpu_node("n0", gpus=16)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    for t, (name, count, cores) in enumerate([("a", 10, 50), ("b", 7, 60), ("c", 6, 60)]):
        s.submit(Workload(name, "q", (share(count, cores),), submit_time=t))
        s.cycle(t)
    assert sorted(s.running) == ["a", "c"]
    s = Scheduler([gpu_node(f"n{i}", gpus=4) for i in range(8)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    for i in range(9):
        s.submit(Workload(f"w{i}", "q", (share(4, 60),), submit_time=i))
    s.cycle(10)
    assert sorted(s.running) == [f"w{i}" for i in range(8)]
    assert len({e.placed[0].node for e in s.running.values()}) == 8


@pytest.mark.parametrize(("a_holds", "order"), [(1, ["a1", "a2", "b1"]), (3, ["a1", "b1", "a2"])])
def test_within_a_cycle_each_start_raises_its_queues_share_before_the_next_pick(a_holds, order):
    """b holds 3 of the 4 GPUs it is entitled to; a holds `a_holds` of a_holds + 2. Of a1, a2 and b1 (1 GPU
    each) a1 goes first. Holding 1, a then has 2 of 3, still below b's 3 of 4, so a2 goes before b1; holding
    3, a then has 4 of 5, above b, so b1 goes before a2."""
    s = Scheduler(
        [gpu_node("n0"), gpu_node("n1")], QueueTree([QueueSpec("a"), QueueSpec("b")]), load_profile("fairgpu")
    )
    s.submit(Workload("a0", "a", (whole(a_holds),)))
    s.submit(Workload("b0", "b", (whole(3),)))
    s.cycle(0)
    for name in ("a1", "b1", "a2"):
        s.submit(Workload(name, name[0], (whole(1),), submit_time=1))
    assert s.cycle(1).started == order


# -- framework/interfaces.py: Evict -----------------------------------------------------------------------------------


def test_a_workload_deleted_while_running_is_recorded_as_evicted_with_no_grace_period(tmp_path):
    """The live recorder's own eviction for pods deleted while running (k8s/recording.py) names no grace
    period: the trace's evict record has none, where an eviction the engine decides carries its queue's."""
    import json

    from fairgpu.framework.interfaces import Evict
    from fairgpu.twin.recorder import Recorder, Seen
    from fairgpu.twin.writer import TraceWriter

    node, wl = gpu_node("n0"), Workload("w", "q", (whole(1),))
    rec = Recorder(TraceWriter(tmp_path / "t.jsonl"), "record")

    def seen(evictions):
        return Seen(
            [node], [QueueSpec("q")], [], ["w"], {"w": wl}.__getitem__, lambda n: ["n0"], lambda n: 0.0, evictions
        )

    rec.observe(0.0, seen(()))
    rec.observe(5.0, seen([Evict("w", "deleted while running"), Evict("w", "preempted for x", 35.0, None, 30.0)]))
    evicts = [r for r in map(json.loads, (tmp_path / "t.jsonl").read_text().splitlines()) if r["kind"] == "evict"]
    assert [r.get("grace") for r in evicts] == [None, 30.0]


# -- framework/cardfit.py: MIG ------------------------------------------------------------------------------------


def test_a_mig_card_registered_with_one_profile_of_one_placement_takes_a_pod_that_fits_it():
    """A card that offers only a 7g.40gb instance (the whole card) takes a pod asking for 30,000 MiB, booked at
    the profile's 40,960 MiB and 100 cores; a second such pod does not fit there."""
    from fairgpu.framework.placement import place_pod
    from fairgpu.model import GpuDevice, GpuRequest, NodeSpec
    from fairgpu.model.mig import MigTemplate

    mig = (MigTemplate("7g.40gb", 40960, 100, 7, ((0, 7),)),)
    card = GpuDevice("NVIDIA A100", 40960, "g", split=7, mode="mig", mig=mig)
    s = Scheduler([NodeSpec("n0", 64000, 256000, (card,))], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    pod = PodSpec(gpu=GpuRequest(count=1, cores=0, mem_mib=30000))
    p = place_pod(pod, s.view, s.profile)
    assert p is not None and (p.node, p.cores, p.mem_mib, p.mig) == (0, (100,), (40960,), (0,))
    s.state.assign("first", p)
    assert place_pod(pod, s.view, s.profile) is None


# -- framework/reservations.py: a preemptor's room beside a starving hold -----------------------------------------


def test_a_preemptor_waiting_for_its_victims_starts_at_once_on_a_free_node_outside_its_room_and_the_hold():
    """As `test_backfill`'s preemptor beside a starving gang (n0 held for it from 100 s), with a third node n2:
    x1 evicts `d` on n1 at 30 s (a 60 s grace period), and before `d` has left, `e` (no duration known) ends
    on n2 and frees 4 GPUs there, neither held for the gang nor part of x1's room. x1 starts there at once:
    only the gang's nodes are held from it, not every node outside its own room (it would wait out `d`'s
    grace with 4 GPUs idle)."""
    from fairgpu.model.queue import PreemptionPolicy

    fair = PreemptionPolicy(fair_share=True)
    queues = QueueTree(
        [
            QueueSpec("stream", preemption=PreemptionPolicy(grace_period=60)),
            QueueSpec("training", starvation_after=0),
            QueueSpec("x", preemption=fair),
        ]
    )
    s = Scheduler([gpu_node("n0"), gpu_node("n1"), gpu_node("n2")], queues, load_profile("fairgpu"))
    running = (
        ("a", 0, range(4), 20, 0.0),
        ("b", 0, range(4, 8), 100, 0.0),
        ("c", 1, range(2), 1000, 0.0),
        ("d", 1, range(2, 8), 1000, 25.0),
        ("e", 2, range(4), None, 0.0),
        ("f", 2, range(4, 8), 1000, 0.0),
    )
    for name, node, slots, duration, start in running:
        w = Workload(name, "stream", (whole(len(slots)),), duration=duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, slots)], started=start)
    s.submit(Workload("gang", "training", (whole(8),), duration=3600))
    s.cycle(0)
    assert list(s.reservations["gang"].fit.nodes) == [0] and s.reservations["gang"].fit.at == 100
    s.remove("a", finished_at=20)
    s.submit(Workload("x1", "x", (whole(4),), submit_time=30, duration=3600))
    assert [(e.workload, e.at) for e in s.cycle(30).evictions] == [("d", 90)]
    s.remove("e", finished_at=40)  # `d` is still leaving
    assert s.cycle(40).started == ["x1"] and s.status("x1").placements[0].node == 2
    s.remove("d", finished_at=90)
    s.remove("b", finished_at=100)
    assert s.cycle(100).started == ["gang"]


def _gang_holding_n0(busy_on_n1: int) -> Scheduler:
    """A starving 8-GPU gang holds n0 from 100 s (a and b run there until 20 s and 100 s); c runs 1000 s on
    `busy_on_n1` GPUs of n1."""
    queues = QueueTree([QueueSpec("stream"), QueueSpec("training", starvation_after=0)])
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], queues, load_profile("fairgpu"))
    running = (("a", 0, range(4), 20), ("b", 0, range(4, 8), 100), ("c", 1, range(busy_on_n1), 1000))
    for name, node, slots, duration in running:
        w = Workload(name, "stream", (whole(len(slots)),), duration=duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, slots)], started=0.0)
    s.submit(Workload("gang", "training", (whole(8),), duration=3600))
    s.cycle(0)
    assert list(s.reservations["gang"].fit.nodes) == [0] and s.reservations["gang"].fit.at == 100
    return s


def test_backfill_that_ends_exactly_when_the_gang_is_due_uses_the_held_node():
    """n0 is held for a starving gang from 100 s; at 20 s four of its GPUs are free and n1 is full. A 1-GPU
    job of 80 s ends at 100 s, not past the gang's start: it backfills on n0 at once."""
    s = _gang_holding_n0(8)
    s.remove("a", finished_at=20)
    s.submit(Workload("exact", "stream", (whole(1),), submit_time=20, duration=80))
    assert s.cycle(20).started == ["exact"] and s.status("exact").placements[0].node == 0


# -- framework/explain.py: reasons --------------------------------------------------------------------------------


def test_a_workload_that_fits_beside_a_gangs_hold_is_not_told_the_nodes_are_held():
    """n0 is held for a starving gang from 100 s; n1 has 6 free GPUs. A 1-GPU job too long to end before the
    gang's start, asked about before the next cycle, must avoid n0 but fits n1: its reason is its queue's
    turn, not the hold (which it is told of only when no node outside the hold fits it)."""
    s = _gang_holding_n0(2)
    s.submit(Workload("late", "stream", (whole(1),), submit_time=1, duration=500))
    (reason,) = s.explain("late", 1).reasons
    assert reason.startswith("fair share: waiting for its turn")


# -- state.py fits: a pod whose containers share a card, as HAMi's fitInDevices fits them in turn ---------------------


@pytest.mark.parametrize(
    ("cores", "mem", "busy", "fits"),
    [
        ((40, 60), (4000, 4000), 0, True),  # 100 cores, 8000 MiB: exactly the card
        ((40, 61), (4000, 4000), 0, False),  # the second container sees the first's cores
        ((40, 60), (4000, 4001), 0, False),  # ... and its memory
        ((10, 10), (100, 100), 0, True),
        ((10, 10), (100, 100), 1, False),  # a task already there: the second container would be the card's 3rd
    ],
)
def test_a_pods_containers_on_one_card_are_checked_against_what_the_ones_before_them_took(cores, mem, busy, fits):
    """One card of 100 cores and 8000 MiB that takes 2 tasks. Two containers of one pod on it fit only as HAMi
    fits them, each seeing what the ones before it took: their cores, their memory, and a task each (so the
    card is never booked past what it has)."""
    from fairgpu.model import GpuDevice, GpuRequest, NodeSpec
    from fairgpu.state import ClusterState, Placement

    st = ClusterState([NodeSpec("n0", 64_000, 1 << 18, (GpuDevice("T4", 8000, uuid="GPU-n0-0", split=2),))])
    if busy:
        st.assign("busy", st.placement_for(PodSpec(gpu=GpuRequest(1, 0, 0, 0)), 0, (0,)))
    p = Placement(0, (0, 0), cores, mem, 100, 100, (1, 1))
    assert st.fits(p) is fits


def test_on_a_mixed_node_a_cores_100_pod_counts_an_idle_100_core_card_as_room():
    """A node with an idle 100-core card and a full 200-core one: the idle card has room for a cores-100 pod,
    so one asking more GPU memory than the card has fails for GPU memory, not for fragmentation."""
    from fairgpu.framework.placement import unplaced_cause
    from fairgpu.model import GpuDevice, GpuRequest, NodeSpec
    from fairgpu.state import ClusterState

    cards = (GpuDevice("T4", 16384, uuid="GPU-n0-0"), GpuDevice("T4", 16384, uuid="GPU-n0-1", cores=200))
    st = ClusterState([NodeSpec("n0", 64_000, 1 << 18, cards)])
    half = PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, 100, 1000))
    for key in ("a", "b"):
        st.assign(key, st.placement_for(half, 0, (1,)))
    big = PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, 100, 20000))
    assert unplaced_cause(big, st) == "GPU memory or task limit"


def test_a_gangs_next_pod_goes_to_the_best_scored_of_the_nodes_the_gang_already_uses():
    """Binpack, in a gang profile. n0 (4 GPUs) holds another pod on one: p1 (1 GPU) takes n0, the fuller; p2 (6
    GPUs) no longer fits there and takes n1 (8 GPUs). p3 (1 GPU) stays on the gang's nodes, and of the two
    Binpack prefers the fuller, n1 (7 of 8 used after it, against 3 of 4), not the first."""
    from fairgpu.catalog import profile_from_dict
    from fairgpu.framework.placement import place_all

    doc = {"name": "t", "queueSort": "PrioritySort", "filter": ["Resources"], "score": ["Binpack"]}
    profile = profile_from_dict({**doc, "gang": True, "permit": ["Gang"]})
    s = Scheduler([gpu_node("n0", gpus=4), gpu_node("n1", gpus=8)], QueueTree([QueueSpec("q")]), profile)
    s.state.assign("other", s.state.placement_for(whole(1), 0, (3,)))
    placed = place_all([whole(1), whole(6), whole(1)], ["p1", "p2", "p3"], s.view, profile)
    assert [p.node for p in placed] == [0, 1, 1]
