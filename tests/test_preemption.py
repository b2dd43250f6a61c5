"""Quotas, borrowing and preemption: the acceptance figures of the built-in scenarios, and a property
test that preemption on random scenarios never ping-pongs, stays bounded and always serves its preemptor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import gpu_node, tree, whole
from fairgpu import fairness
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.errors import RequestError, StateError
from fairgpu.framework.interfaces import EngineView, PreemptContext
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import QueueSpec, QueueTree, Workload
from fairgpu.sim import scenario as scenarios
from fairgpu.sim.runner import SimResult, Simulation

_cache: dict[str, tuple[scenarios.Scenario, SimResult, Simulation]] = {}


def run(name: str) -> tuple[scenarios.Scenario, SimResult, Simulation]:
    if name not in _cache:
        sc = scenarios.load(name)
        sim = Simulation(sc, load_profile("fairgpu"))
        _cache[name] = (sc, sim.run(), sim)
    return _cache[name]


def gpus_at(res: SimResult, sc: scenarios.Scenario, queue: str, t: float) -> float:
    """GPUs the queue held at time t (the sample in force then)."""
    tl = res.timeline
    i = int(np.searchsorted(tl.t, t, side="right")) - 1
    return float(tl.gpus[i][sc.tree().index[queue]])


def held_between(res: SimResult, sc: scenarios.Scenario, queue: str, start: float, end: float) -> np.ndarray:
    tl, q = res.timeline, sc.tree().index[queue]
    return np.array([g[q] for t, g in zip(tl.t, tl.gpus, strict=True) if start <= t < end])


def test_reclaim_returns_the_guarantee_within_the_grace_period():
    sc, res, _ = run("reclaim")
    returns, grace = 2 * 3600, 300
    assert held_between(res, sc, "b", 1800, returns).min() == 64  # b kept the borrowed GPUs while a was idle
    assert gpus_at(res, sc, "a", returns + grace) == 32  # the cycle when the victims' grace ends
    assert res.queues["b"]["preempted"] == 32 and res.queues["a"]["preempted"] == 0
    # Minimal loss: the victims are the 32 of b's 64 running jobs that started last (one every 10 s).
    minimal = sum(returns + grace - 10.0 * k for k in range(32, 64)) / 3600
    assert res.queues["b"]["lost_gpu_hours"] == pytest.approx(minimal)


def test_static_partition_is_never_exceeded_nor_borrowed():
    sc, res, _ = run("static-partition")
    tl, tree = res.timeline, sc.tree()
    a, b = tree.index["a"], tree.index["b"]
    assert max(g[a] for g in tl.gpus) == 16  # even with 48 GPUs idle for three hours
    assert max(g[b] for g in tl.gpus) == 48  # even while a is idle
    assert held_between(res, sc, "a", 0, 3600).max() == 16


def test_non_preemptive_queue_waits_for_work_to_finish():
    sc, res, _ = run("non-preemptive")
    assert res.evictions == 0
    returns, longest = 2 * 3600, 3600  # b's jobs run at most an hour
    tl, q = res.timeline, sc.tree().index["a"]
    i = int(np.searchsorted(tl.t, returns + longest, side="right")) - 1
    assert tl.gpus[i][q] >= 0.9 * tl.entitled_gpus[i][q]


def test_fair_share_preemption_reaches_the_share_at_once_with_minimal_evictions():
    sc, res, _ = run("fair-share-preemption")
    arrives, grace = 2 * 3600, 120
    tl, q = res.timeline, sc.tree().index["c"]
    i = int(np.searchsorted(tl.t, arrives + grace, side="right")) - 1
    assert tl.gpus[i][q] >= 0.9 * tl.entitled_gpus[i][q]
    # Bound: every eviction frees exactly one GPU that c then uses, so evictions <= c's entitlement (32).
    assert res.evictions <= tl.entitled_gpus[i][q] + 1e-9
    assert res.queues["a"]["preempted"] == res.queues["b"]["preempted"]  # from both, down to their share


def test_no_gang_is_ever_left_partly_running():
    sc = scenarios.load("gang-victims")
    sim = Simulation(sc, load_profile("fairgpu"))
    evicted = 0
    for t in range(0, int(sc.horizon) + 1, 60):
        sim.run_until(t)
        for entry in sim.sched.running.values():
            assert len(entry.placed) == len(entry.workload.pods), entry.workload.name
        evicted = sum(sim.preempted.values())
    assert evicted > 0  # gangs were victims, and each went whole


def test_priority_within_queue_evicts_only_the_queues_own_lower_priority_work():
    _, res, _ = run("priority-within-queue")
    assert res.queues["a"]["preempted"] == 8 and res.queues["b"]["preempted"] == 0
    assert all(res.starts[f"urgent-{k}"] <= 30 * 60 + 60 for k in range(8))  # within the 1-minute grace


def test_elastic_workloads_shrink_before_any_whole_workload_is_evicted():
    sc, res, _ = run("elastic")
    assert res.queues["b"]["preempted"] == 16  # sixteen extra pods given back, one at a time
    assert res.queues["b"]["lost_gpu_hours"] == 0  # no whole elastic workload was evicted
    assert gpus_at(res, sc, "a", 3600 + 600) == 16
    assert gpus_at(res, sc, "b", 3599) == 32  # grown into the idle cluster first


# -- property: random scenarios --------------------------------------------------------------------------------


@st.composite
def random_scenarios(draw: st.DrawFn) -> dict:
    nq = draw(st.integers(2, 3))
    queues, workloads = [], []
    for i in range(nq):
        policy = {
            "reclaim": draw(st.booleans()),
            "fair_share": draw(st.booleans()),
            "within_queue": draw(st.sampled_from(["Never", "LowerPriority"])),
            "min_runtime": draw(st.sampled_from([0, 300, 1200])),
            "grace_period": draw(st.sampled_from([0, 60, 300])),
            "fair_share_max_runtime": draw(st.sampled_from([None, 600, 3600])),
        }
        q = {"name": f"q{i}", "weight": draw(st.sampled_from([1, 2])), "preemption": policy}
        if draw(st.booleans()):
            q["guaranteed"] = {"nvidia.com/gpu": draw(st.integers(1, 8))}
        queues.append(q)
        for k in range(draw(st.integers(1, 3))):
            workloads.append(
                {
                    "queue": f"q{i}",
                    "name": f"w{i}x{k}",
                    "at": draw(st.integers(0, 7200)),
                    "count": draw(st.integers(1, 12)),
                    "every": draw(st.sampled_from([0, 30, 300])),
                    "pods": draw(st.integers(1, 3)),
                    "priority": draw(st.sampled_from([0, 0, 10])),
                    "duration": draw(st.sampled_from(["10m", "1h", "3h"])),
                    "requests": {"nvidia.com/gpu": draw(st.integers(1, 4)), "cpu": "1", "memory": "1Gi"},
                }
            )
    return {
        "name": "random",
        "horizon": "6h",
        "cluster": {
            "nodes": [{"count": 2, "gpus": 8, "gpu_model": "A100", "gpu_memory": "80Gi", "cpu": 64, "memory": "512Gi"}]
        },
        "queues": queues,
        "workloads": workloads,
    }


class Recorder:
    """Wraps the profile's Preempt plugin and checks every decision it returns when it is made (the view
    it was made in changes afterwards): no-ping-pong, min_runtime and fair_share_max_runtime."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.decisions = 0

    def may_find(self, view: EngineView, queue: int, charge: np.ndarray, least_usage: np.ndarray) -> bool:
        return bool(self.inner.may_find(view, queue, charge, least_usage))

    def preempt(self, ctx: PreemptContext) -> np.ndarray | None:
        chosen = self.inner.preempt(ctx)
        if chosen is None or not len(chosen):
            return chosen
        self.decisions += 1
        t, p, tree = ctx.victims, ctx.queue, ctx.view.tree
        # After the evictions the preemptor's queue's share ratio (with the new workload) is no higher than
        # that of any other queue it evicts from: the victims' queue then has no claim to evict back.
        after_p = share_ratio(ctx, p, ctx.usage[p] + ctx.charge)
        for q in set(t.queue[chosen].tolist()) - {p}:
            gone = t.charge[chosen][t.queue[chosen] == q].sum(axis=0)
            assert after_p <= share_ratio(ctx, q, ctx.usage[q] - gone) + 1e-9, (ctx.workload.name, q)
        min_runtime = np.array([tree.queues[q].preemption.min_runtime for q in t.queue[chosen]])
        ran = ctx.now - t.started[chosen]
        assert (ran >= min_runtime).all(), ctx.workload.name
        # Work that ran past its queue's fair_share_max_runtime goes only to reclaim or within its own queue.
        bound = np.array([tree.queues[q].preemption.fair_share_max_runtime for q in t.queue[chosen]])
        policy = tree.queues[p].preemption
        reclaims = policy.reclaim and bool(np.all(ctx.usage[p] + ctx.charge <= tree.guaranteed[p] + 1e-9))
        for q in t.queue[chosen][ran >= bound]:
            assert q == p or (reclaims and np.any(ctx.usage[q] > tree.guaranteed[q] + 1e-9)), ctx.workload.name
        return chosen


def share_ratio(ctx: PreemptContext, q: int, usage: np.ndarray) -> float:
    dom = float(fairness.dominant_shares(usage, ctx.view.capacity))
    ent = float(ctx.view.entitled_dom[q])
    return dom / ent if ent > 0 else float("inf")


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(random_scenarios())
def test_preemption_never_ping_pongs_is_bounded_and_serves_its_preemptor(doc):
    sc = scenarios.build(doc)
    sim = Simulation(sc, load_profile("fairgpu"))
    recorder = Recorder(sim.sched.profile.preempt[0])
    sim.sched.profile.preempt[0] = recorder
    log: list[tuple[float, str, str, str, str]] = []  # (time, victim, victim queue, preemptor, its queue)
    original = sim.sched.cycle
    by_name = {w.name: w for w in sc.workloads}

    started: set[str] = set()  # every workload that ever started (a preemptor may be evicted later)

    def recording(now: float):
        result = original(now)
        started.update(result.started)
        for ev in result.evictions:
            preemptor = ev.reason.removeprefix("preempted for ")
            log.append((now, ev.workload, by_name[ev.workload].queue, preemptor, by_name[preemptor].queue))
        return result

    sim.sched.cycle = recording  # type: ignore[method-assign]
    res = sim.run()
    tree = sc.tree()
    # 1. No ping-pong and min_runtime: checked by the recorder as each decision is made.
    assert recorder.decisions == len({(t, p) for t, _, _, p, _ in log})
    # 2. Bounded: a preemptor decides once (it then holds the room until its victims are gone), and each
    #    victim it picks holds at least one GPU on the node one of its pods needs; so, per preemptor,
    #    evictions <= the GPUs its pods ask for. Per life, that is: a preemptor evicted in turn is queued
    #    again, and may preempt again.
    lives: dict[str, int] = {}
    per_preemptor: dict[tuple[str, int], int] = {}
    for _, victim, _, p, _ in log:
        per_preemptor[p, lives.get(p, 0)] = per_preemptor.get((p, lives.get(p, 0)), 0) + 1
        lives[victim] = lives.get(victim, 0) + 1
    for (p, _), n in per_preemptor.items():
        assert n <= sum(pod.gpu.count for pod in by_name[p].pods), (p, n)
    # 3. Every eviction is followed by its preemptor's placement, once the victims' grace has passed
    #    (unless the horizon came first).
    grace = {q.name: q.preemption.grace_period for q in tree.queues}
    for t, _, _, p, _ in log:
        if t + max(grace.values()) < res.horizon_s:
            assert p in started, (p, t)
    for entry in sim.sched.running.values():
        assert len(entry.placed) >= entry.workload.needed
    sim.sched.state.check_invariants()


def test_a_refused_eviction_leaves_the_victim_eligible_again():
    """A PodDisruptionBudget can refuse an eviction: the victim keeps running, stops counting as leaving,
    and the next preemption decision may pick it (or another) again."""
    sc = scenarios.load("reclaim")
    sim = Simulation(sc, load_profile("fairgpu"))
    sim.run_until(2 * 3600 - 1)
    sched = sim.sched
    a = next(w for w in sc.workloads if w.queue == "a")
    sched.submit(a)
    first = sched.cycle(2 * 3600)
    assert len(first.evictions) == 1
    victim = first.evictions[0].workload
    assert sched.running[victim].terminating and sched.preempting.leaving.any()
    sched.eviction_refused(victim, retry_at=2 * 3600)
    assert not sched.running[victim].terminating and not sched.preempting.leaving.any()
    sched.remove(a.name)  # the preemptor gives up its claim; a new one must be able to choose the victim
    sched.submit(a)
    again = sched.cycle(2 * 3600 + 1)
    assert [e.workload for e in again.evictions] == [victim]


def test_a_refused_victim_is_passed_over_until_its_back_off_ends():
    """A refusal voids the room its preemptor planned with: at its next attempt it picks another victim;
    the refused one is not chosen again before its back-off ends."""
    sc = scenarios.load("reclaim")
    sim = Simulation(sc, load_profile("fairgpu"))
    t = 2 * 3600 - 1
    sim.run_until(t)
    sched = sim.sched
    a = next(w for w in sc.workloads if w.queue == "a")
    sched.submit(a)
    refused = sched.cycle(t).evictions[0].workload
    assert a.name in sched.reservations
    sched.eviction_refused(refused, retry_at=t + 3600)
    assert a.name not in sched.reservations
    second = sched.cycle(t + 1).evictions
    assert len(second) == 1 and second[0].workload != refused
    sched.eviction_refused(second[0].workload, retry_at=t + 2)
    third = sched.cycle(t + 3).evictions  # the second refusal's back-off is over, the first's not
    assert [e.workload for e in third] == [second[0].workload]


def test_shrink_for_good_keeps_only_the_pods_that_still_run():
    """A live cluster deletes an elastic workload's evicted pods: the workload keeps the pods it runs, its
    demand shrinks with it, and it does not grow back into pods that no longer exist."""
    sched = Scheduler([gpu_node("n0")], tree("q"), load_profile("fairgpu"))
    wl = Workload("e", "q", (whole(1),) * 4, duration=3600.0, min_pods=2)
    sched.submit(wl)
    assert len(sched.cycle(0.0).bound) == 4
    entry = sched.running["e"]
    one = sched.accounting.charge(whole(1))
    sched.shrink("e", (3,), regrow=False)
    assert len(entry.workload.pods) == len(entry.placed) == 3 and entry.workload.pod_names == wl.pod_names[:3]
    assert np.allclose(sched.view.demand[0], 3 * one) and np.allclose(entry.charge, 3 * one)
    assert sched.state.placement(wl.pod_names[3]) is None
    assert sched.cycle(1.0).bound == []  # room is free, but nothing to grow into
    sched.remove("e")
    assert np.allclose(sched.view.demand, 0) and all(sched.state.placement(k) is None for k in wl.pod_names)
    sched.state.check_invariants()


def test_an_adopted_workload_is_charged_and_reclaimed_like_a_placed_one():
    """A driver restarted (or rebuilt its engine) finds pods running: adopted, they count against their
    queue and are victims when a lender takes its guarantee back; adoption that cannot hold changes nothing."""
    guaranteed = QueueSpec("a", guaranteed=r.quota_vector({"nvidia.com/gpu": 4}, default=np.inf))
    sched = Scheduler([gpu_node("n0")], QueueTree([guaranteed, QueueSpec("b")]), load_profile("fairgpu"))
    probe = Scheduler([gpu_node("n0")], tree("b"), load_profile("fairgpu"))
    probe.submit(Workload("b-all", "b", (whole(1),) * 8, duration=3600.0))
    places = [b.placement for b in probe.cycle(0.0).bound]
    borrowed = [Workload(f"b{i}", "b", (whole(1),), duration=3600.0) for i in range(8)]
    with pytest.raises(RequestError):
        sched.adopt(Workload("x", "nowhere", (whole(1),)), places[:1], started=0.0)
    for wl, p in zip(borrowed, places, strict=True):
        sched.adopt(wl, [p], started=0.0)
    with pytest.raises(StateError):  # the node is full: nothing of it is kept
        sched.adopt(Workload("extra", "b", (whole(1),) * 2), places[:2], started=0.0)
    assert "extra" not in sched.running and sched.state.placement("extra-0") is None
    assert sched.view.usage[1, r.DIM_GPU] == 8 and sched.view.demand[1, r.DIM_GPU] == 8
    sched.submit(Workload("a0", "a", (whole(1),) * 2, duration=3600.0))
    evicted = sched.cycle(10.0).evictions
    assert len(evicted) == 2 and {e.workload for e in evicted} <= {w.name for w in borrowed}
    sched.state.check_invariants()


@pytest.mark.parametrize("pods,gpus", [(2, 1), (3, 2), (4, 4)])
def test_a_preemptor_of_several_pods_makes_room_for_every_one(pods: int, gpus: int):
    """Room made for one pod of the preemptor is not room for the next: each gets victims of its own."""
    guaranteed = QueueSpec("a", guaranteed=r.quota_vector({"nvidia.com/gpu": 16}, default=np.inf))
    sched = Scheduler(
        [gpu_node("n0"), gpu_node("n1")], QueueTree([guaranteed, QueueSpec("b")]), load_profile("fairgpu")
    )
    for i in range(16):
        sched.submit(Workload(f"b{i}", "b", (whole(1),), duration=3600.0))
    assert len(sched.cycle(0.0).bound) == 16
    sched.submit(Workload("a0", "a", (whole(gpus),) * pods, duration=3600.0))
    evicted = sched.cycle(10.0).evictions
    assert len(evicted) == pods * gpus
    for e in evicted:
        sched.remove(e.workload)
    assert sched.cycle(11.0).started == ["a0"]


@settings(max_examples=60, deadline=None)
@given(
    victim=st.sampled_from([1, 2, 4]),
    shape=st.sampled_from([(k, g) for k in range(1, 5) for g in (1, 2, 4, 8) if k * g <= 16]),
)
def test_reclaim_always_makes_room_for_a_preemptor_within_its_guarantee(victim: int, shape: tuple[int, int]):
    """Liveness: whatever the borrowers' pod sizes and the preemptor's shape (pods × GPUs), a workload within
    its queue's guarantee gets exactly the victims it needs, and starts once they are gone. Victims that
    cannot add up to the ask exactly would leave the preemptor's queue above the victims' after the
    evictions, which no-ping-pong forbids: then nothing is evicted (a coarse victim is not taken for a
    small ask)."""
    pods, gpus = shape
    guaranteed = QueueSpec("a", guaranteed=r.quota_vector({"nvidia.com/gpu": 16}, default=np.inf))
    sched = Scheduler(
        [gpu_node("n0"), gpu_node("n1")], QueueTree([guaranteed, QueueSpec("b")]), load_profile("fairgpu")
    )
    for i in range(16 // victim):
        sched.submit(Workload(f"b{i}", "b", (whole(victim),), duration=3600.0))
    sched.cycle(0.0)
    sched.submit(Workload("a0", "a", (whole(gpus),) * pods, duration=3600.0))
    evicted = sched.cycle(10.0).evictions
    if pods * gpus % victim:  # only victims coarser than the ask could make room: no-ping-pong waits
        assert evicted == [] and "a0" in sched.pending
        return
    assert victim * len(evicted) == pods * gpus, evicted
    for e in evicted:
        sched.remove(e.workload)
    assert sched.cycle(11.0).started == ["a0"]
    sched.state.check_invariants()
