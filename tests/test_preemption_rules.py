"""Preemption rules as a tenant sees them: who is evicted, for whom, and when — in asymmetric scenarios
where a broken rule picks a different victim (no ping-pong, min_runtime, fair share only up to the share,
the victim order, `preemptible: false`, the grace period)."""

from __future__ import annotations

import numpy as np

from conftest import gpu_node, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import QueueSpec, QueueTree, Workload
from fairgpu.model.queue import PreemptionPolicy
from fairgpu.sim import scenario as scenarios
from fairgpu.sim.runner import Simulation


def gpus(n: float) -> np.ndarray:
    return r.quota_vector({"nvidia.com/gpu": n}, default=np.inf)


def held(sched: Scheduler, queue: str) -> float:
    return float(sched.view.usage[sched.tree.index[queue], r.DIM_GPU])


def engine(queues: list[QueueSpec], nodes: int = 1) -> Scheduler:
    return Scheduler([gpu_node(f"n{i}") for i in range(nodes)], QueueTree(queues), load_profile("fairgpu"))


def run(sched: Scheduler, queue: str, n: int, t: float, size: int = 1, prefix: str = "", **kw) -> list[str]:
    """Submit n workloads of `size` GPUs at t (the names they get)."""
    names = [f"{prefix or queue}{i}" for i in range(n)]
    for name in names:
        sched.submit(Workload(name, queue, (whole(size),), submit_time=t, duration=36000.0, **kw))
    return names


def evicted(result) -> list[str]:
    return sorted(e.workload for e in result.evictions)


def test_a_small_reclaim_never_evicts_a_much_larger_victim():
    """No ping-pong: a 1-GPU reclaim from an 8-GPU victim would leave the reclaiming queue above the
    victim's (it would borrow the other 7 back at once, and the victim's queue then take them by fair
    share). So it waits; the same reclaim from 1-GPU victims evicts exactly one."""
    for size, count, expect in ((8, 1, 0), (1, 8, 1)):
        sched = engine([QueueSpec("a", guaranteed=gpus(8)), QueueSpec("b")])
        run(sched, "b", count, 0.0, size=size)
        sched.cycle(0.0)
        assert held(sched, "b") == 8
        run(sched, "a", 1, 10.0)
        assert len(sched.cycle(10.0).evictions) == expect, (size, count)


def test_a_victim_younger_than_its_queues_min_runtime_is_not_evicted():
    """b's jobs: seven started at 0 s, one at 500 s; b's min_runtime is 300 s. A reclaim at 600 s would
    lose least by evicting the youngest, but it has run only 100 s: an old one goes instead."""
    sched = engine([QueueSpec("a", guaranteed=gpus(4)), QueueSpec("b", preemption=PreemptionPolicy(min_runtime=300))])
    old = run(sched, "b", 7, 0.0)
    sched.cycle(0.0)
    run(sched, "b", 1, 500.0, prefix="young")
    sched.cycle(500.0)
    run(sched, "a", 1, 600.0)
    result = sched.cycle(600.0)
    assert len(result.evictions) == 1 and result.evictions[0].workload in old
    # Before min_runtime has passed for any of b's work, nothing is evicted.
    early = engine([QueueSpec("a", guaranteed=gpus(4)), QueueSpec("b", preemption=PreemptionPolicy(min_runtime=300))])
    run(early, "b", 8, 0.0)
    early.cycle(0.0)
    run(early, "a", 1, 200.0)
    assert early.cycle(200.0).evictions == []


def fair_share_cluster(b_policy: PreemptionPolicy) -> Scheduler:
    """16 GPUs; weights a 1, b 2, c 1, all with more demand than share: entitled a 4, b 8, c 4. Running:
    a 5 (ratio 1.25), b 4 (0.5), c 7 (1.75); a and b each have one more 1-GPU job pending."""
    fair = PreemptionPolicy(reclaim=False, fair_share=True)
    sched = engine(
        [QueueSpec("a", 1, preemption=fair), QueueSpec("b", 2, preemption=b_policy), QueueSpec("c", 1)], nodes=2
    )
    run(sched, "a", 5, 0.0)
    run(sched, "b", 4, 0.0)
    run(sched, "c", 7, 0.0)
    sched.cycle(0.0)
    for q in ("a", "b", "c"):
        sched.submit(Workload(f"{q}-more", q, (whole(4),), submit_time=5.0, duration=36000.0, priority=-1))
    run(sched, "a", 1, 10.0, prefix="a-next")
    run(sched, "b", 1, 10.0, prefix="b-next")
    sched.refresh_shares(10.0)
    ratio = dict(zip(sched.tree.names(), sched.view.share_ratio, strict=True))
    assert np.allclose([ratio["a"], ratio["b"], ratio["c"]], [1.25, 0.5, 1.75])
    return sched


def test_fair_share_preemption_stops_at_the_preemptors_share():
    """a is above its share (1.25) and c further above (1.75): a may not evict c to grow further, though
    c would stay above a afterwards."""
    sched = fair_share_cluster(PreemptionPolicy(enabled=False))
    result = sched.cycle(10.0)
    assert result.evictions == [] and "a-next0" in sched.pending


def test_fair_share_victims_come_from_the_queue_furthest_above_its_share():
    """b (ratio 0.5) reclaims its fair share: c (1.75) is further above its share than a (1.25), so c's
    work goes, not a's — though a's could go without breaking no-ping-pong either."""
    sched = fair_share_cluster(PreemptionPolicy(reclaim=False, fair_share=True))
    result = sched.cycle(10.0)
    assert len(result.evictions) == 1 and result.evictions[0].workload.startswith("c")
    assert result.evictions[0].reason == "preempted for b-next0"


def test_preemptible_false_protects_work_of_a_queue_within_its_guarantee():
    """Queue a (guarantee 8) runs four non-preemptible jobs that started last and four preemptible ones
    that started first. A higher-priority job of its own evicts a preemptible one, though the others
    would lose less work. Once a borrows above its guarantee, a lender may reclaim non-preemptible work."""
    within = PreemptionPolicy(within_queue="LowerPriority")
    sched = engine([QueueSpec("a", guaranteed=gpus(8), preemption=within)])
    movable = run(sched, "a", 4, 0.0, prefix="movable")
    sched.cycle(0.0)
    run(sched, "a", 4, 100.0, prefix="pinned", preemptible=False)
    sched.cycle(100.0)
    run(sched, "a", 1, 200.0, prefix="urgent", priority=10)
    result = sched.cycle(200.0)
    assert len(result.evictions) == 1 and result.evictions[0].workload in movable
    # Above its guarantee, the protection ends: b reclaims from the pinned (cheapest) work.
    lent = engine([QueueSpec("a", guaranteed=gpus(2)), QueueSpec("b", guaranteed=gpus(6))])
    run(lent, "a", 4, 0.0, prefix="movable")
    lent.cycle(0.0)
    pinned = run(lent, "a", 4, 100.0, prefix="pinned", preemptible=False)
    lent.cycle(100.0)
    run(lent, "b", 1, 200.0)
    result = lent.cycle(200.0)
    assert len(result.evictions) == 1 and result.evictions[0].workload in pinned


def test_an_eviction_gives_the_victim_its_queues_grace_period_before_the_preemptor_runs():
    """b's grace period is 300 s: the victim is told so, keeps its GPU until it leaves, and the preemptor
    does not start before the grace has passed, even on a cycle in between."""
    sched = engine([QueueSpec("a", guaranteed=gpus(4)), QueueSpec("b", preemption=PreemptionPolicy(grace_period=300))])
    run(sched, "b", 8, 0.0)
    sched.cycle(0.0)
    run(sched, "a", 1, 1000.0)
    (ev,) = sched.cycle(1000.0).evictions
    assert (ev.grace, ev.at) == (300.0, 1300.0)
    assert held(sched, "b") == 8
    assert sched.cycle(1100.0).started == [] and sched.cycle(1100.0).evictions == []
    sched.remove(ev.workload)
    assert sched.cycle(1300.0).started == ["a0"]


def pools() -> Scheduler:
    """n0 (pool x) full of b's borrowed 1-GPU jobs; n1 (pool y) half held by c within its guarantee (never
    a victim), half free. a is guaranteed 12 GPUs and uses none."""
    sched = Scheduler(
        [gpu_node("n0", labels={"pool": "x"}), gpu_node("n1", labels={"pool": "y"})],
        QueueTree([QueueSpec("a", guaranteed=gpus(12)), QueueSpec("b"), QueueSpec("c", guaranteed=gpus(4))]),
        load_profile("fairgpu"),
    )
    for i in range(4):
        sched.submit(Workload(f"c{i}", "c", (whole(1, node_selector=(("pool", "y"),)),), duration=36000.0))
    for i in range(8):
        sched.submit(Workload(f"b{i}", "b", (whole(1, node_selector=(("pool", "x"),)),), duration=36000.0))
    sched.cycle(0.0)
    assert held(sched, "b") == 8 and held(sched, "c") == 4
    return sched


def test_a_gang_whose_first_pod_fits_in_free_room_reclaims_room_for_the_rest():
    """The gang's first pod (4 GPUs) fits in n1's free half, where there is no victim; its second pod takes
    the four cheapest of b's jobs on n0. (It used to give up: no victim on the node its first pod fits.)"""
    sched = pools()
    sched.submit(Workload("gang", "a", (whole(4),) * 2, submit_time=10.0, duration=3600.0))
    result = sched.cycle(10.0)
    assert len(result.evictions) == 4 and all(e.workload.startswith("b") for e in result.evictions)
    for e in result.evictions:
        sched.remove(e.workload)
    assert sched.cycle(11.0).started == ["gang"]


def test_evictions_after_which_the_preemptor_would_still_not_fit_are_not_made():
    """Pod by pod, evicting all of b makes room: 4 GPUs on n1, 8 on n0. But the first pod asks HAMi to
    spread (the node with most room), so once b is gone it would take n0 and leave the 8-GPU pod nowhere:
    the dry run catches it and nothing is evicted. Without `spread` the same gang evicts b and starts."""
    for policy, evictions in (("spread", 0), ("", 8)):
        sched = pools()
        pods = (whole(4, node_policy=policy), whole(8))
        sched.submit(Workload("gang", "a", pods, submit_time=10.0, duration=3600.0))
        result = sched.cycle(10.0)
        assert len(result.evictions) == evictions, policy
        for e in result.evictions:
            sched.remove(e.workload)
        assert sched.cycle(11.0).started == ([] if policy else ["gang"])


def test_in_a_scenario_the_victims_keep_their_gpus_through_the_grace_period():
    """The reclaim scenario (grace 300 s, written in its YAML): a gets its guarantee back exactly when the
    grace of b's victims ends — not at once."""
    sc = scenarios.load("reclaim")
    res = Simulation(sc, load_profile("fairgpu")).run()
    returns, grace, a = 2 * 3600, 300, sc.tree().index["a"]
    tl = res.timeline

    def gpus_at(t: float) -> float:
        return float(tl.gpus[int(np.searchsorted(tl.t, t, side="right")) - 1][a])

    assert sc.tree().queues[sc.tree().index["b"]].preemption.grace_period == grace
    assert gpus_at(returns + grace - 1) < 32 <= gpus_at(returns + grace)


def test_fair_share_evicts_only_work_younger_than_the_victims_fair_share_max_runtime():
    """c's eight 1-GPU jobs started at 0 s; a (fair share, no reclaim) wants 4 at 1000 s. With c's
    fair_share_max_runtime at 1000 s (exactly as long as they ran) they are safe; at 1001 s, or unbounded,
    a's share is evicted for it."""
    for bound, expect in ((1000.0, 0), (1001.0, 4), (float("inf"), 4)):
        fair = PreemptionPolicy(reclaim=False, fair_share=True)
        c = PreemptionPolicy(fair_share_max_runtime=bound)
        sched = engine([QueueSpec("a", preemption=fair), QueueSpec("c", preemption=c)])
        run(sched, "c", 8, 0.0)
        sched.cycle(0.0)
        run(sched, "a", 4, 1000.0)
        gone = evicted(sched.cycle(1000.0))
        assert len(gone) == expect and all(v.startswith("c") for v in gone), (bound, gone)


def test_fair_share_max_runtime_does_not_bound_reclaim():
    """a's guarantee of 4 GPUs, lent to c, comes back however long c's jobs have run: the bound limits only
    evictions for fair share, never what a queue is guaranteed."""
    c = PreemptionPolicy(fair_share_max_runtime=10.0)
    sched = engine([QueueSpec("a", guaranteed=gpus(4)), QueueSpec("c", preemption=c)])
    run(sched, "c", 8, 0.0)
    sched.cycle(0.0)
    run(sched, "a", 4, 1000.0)
    assert len(evicted(sched.cycle(1000.0))) == 4


def test_fair_share_evicts_only_when_the_wait_it_saves_outweighs_the_work_it_throws_away():
    """c's eight 1-GPU jobs started at 0 s; a (fair share, no reclaim) wants 4 GPUs at 1000 s. Each victim
    has run 1000 GPU-seconds. If c's jobs end at 1500 s anyway, evicting one would save a's job 500 s less
    the grace: less than it throws away, so nothing is evicted and a starts at 1500 s. If they end at
    36,000 s, or nobody knows when, a's share is evicted for it."""
    for duration, expect in ((1500.0, 0), (36000.0, 4), (None, 4)):
        sched = engine([QueueSpec("a", preemption=PreemptionPolicy(reclaim=False, fair_share=True)), QueueSpec("c")])
        for i in range(8):
            sched.submit(Workload(f"c{i}", "c", (whole(1),), submit_time=0.0, duration=duration))
        sched.cycle(0.0)
        run(sched, "a", 4, 1000.0)
        gone = evicted(sched.cycle(1000.0))
        assert len(gone) == expect and all(v.startswith("c") for v in gone), (duration, gone)


def test_fair_share_eviction_counts_the_gpu_time_until_the_victims_queue_would_be_back_within_its_share():
    """c holds the node's 8 GPUs: c0..c3 since 0 s, c4..c7 since 850 s. a (fair share, no reclaim) has four
    1-GPU jobs waiting at 1000 s: with both wanting all, each is entitled to 4. c0 ends at 1100 s. If c1..c3
    run on to 36,000 s, c would hold more than its 4 until then, so every GPU it frees before goes to a: an
    eviction gives a one GPU-time within its share until 36,000 s, for 150 GPU-seconds thrown away (the
    youngest: c4, c5, c6). Three are evicted, not four: c is then back within its 4 when c0 ends, and a's
    last job waits 100 s for c0's GPU rather than throw 150 away. Judged by a's head alone (a GPU at 1100 s,
    100 s sooner) none is worth it. If c1..c3 end at 1100 s too, c is back within its share then and a gets
    its 4 GPUs without eviction: nothing is evicted. Nor if c4 (the first victim in the cost order) ends at
    1140 s: evicting it would give a a GPU 140 s before c4's own would have come to it, for 150 GPU-seconds
    thrown away, though c stays above its share until 36,000 s."""
    for others_end, young_end, expect in (
        (36000.0, 36000.0, ["c4", "c5", "c6"]),
        (1100.0, 36000.0, []),
        (36000.0, 1140.0, []),
    ):
        sched = engine([QueueSpec("a", preemption=PreemptionPolicy(reclaim=False, fair_share=True)), QueueSpec("c")])
        for i in range(8):
            start = 0.0 if i < 4 else 850.0
            end = 1100.0 if i == 0 else others_end if i < 4 else young_end if i == 4 else 36000.0
            sched.submit(Workload(f"c{i}", "c", (whole(1),), submit_time=start, duration=end - start))
            sched.cycle(start)
        run(sched, "a", 4, 1000.0)
        assert evicted(sched.cycle(1000.0)) == expect, (others_end, young_end)


def _a_day_of_all_gpus(sched: Scheduler, queue: str) -> None:
    """`queue` runs 8 one-GPU jobs from 0 s to 86,400 s, then they end: a day of past usage."""
    run(sched, queue, 8, 0.0, prefix="day")
    sched.cycle(0.0)
    sched.cycle(86399.0)  # past usage accrues at each cycle, with what runs then
    for i in range(8):
        sched.remove(f"day{i}", finished_at=86400.0)


def test_fair_share_eviction_counts_past_usage_as_the_queue_order_does():
    """old (fair share, 6 h usage half-life) ran all 8 GPUs for a day; then new starts 6 jobs and old 2, and
    at 86,500 s old wants 2 more. By current usage old holds 2 of the 4 it is entitled to, but with its past
    usage it is far above its share, and FairShare serves new first: old evicts nothing (it did by current
    usage alone, and new's next start was evicted again). Without past usage (half-life 0) it evicts two."""
    fair = PreemptionPolicy(fair_share=True)
    for half_life, expect in ((21600.0, 0), (0.0, 2)):
        sched = engine([QueueSpec("old", usage_half_life=half_life, preemption=fair), QueueSpec("new")])
        _a_day_of_all_gpus(sched, "old")
        run(sched, "new", 6, 86400.0)
        sched.cycle(86400.0)
        run(sched, "old", 2, 86400.0)
        sched.cycle(86400.0)
        run(sched, "old", 2, 86500.0, prefix="more")
        gone = evicted(sched.cycle(86500.0))
        assert len(gone) == expect and all(v.startswith("new") for v in gone), (half_life, gone)


def test_the_reclaim_profile_lets_every_queue_that_may_preempt_evict_for_its_fair_share():
    """The same cluster under fairgpu and fairgpu-reclaim (Preemption's `fair_share`): c holds all 8 GPUs
    with work that runs for hours, started at 7 s; a, with a default policy (no fair_share), wants 4 at 60 s.
    Only under fairgpu-reclaim does a evict (four of c's jobs: its share), and a queue whose policy is
    `never` evicts under neither."""
    from fairgpu.model.queue import NEVER

    for profile, policy, expect in (
        ("fairgpu", PreemptionPolicy(), 0),
        ("fairgpu-reclaim", PreemptionPolicy(), 4),
        ("fairgpu-reclaim", NEVER, 0),
    ):
        sched = Scheduler(
            [gpu_node("n0")], QueueTree([QueueSpec("a", preemption=policy), QueueSpec("c")]), load_profile(profile)
        )
        for i in range(8):
            sched.submit(Workload(f"c{i}", "c", (whole(1),), submit_time=i, duration=36000.0))
        sched.cycle(7.0)
        run(sched, "a", 4, 60.0)
        gone = evicted(sched.cycle(60.0))
        assert len(gone) == expect and all(v.startswith("c") for v in gone), (profile, policy, gone)


def test_reclaim_and_priority_evict_even_where_waiting_would_throw_away_less_work():
    """The worth-it rule is for fair share alone. As above, c's eight 1-GPU jobs started at 0 s and end at
    1500 s, so from 1000 s waiting would throw away less work than evicting: yet a's guarantee of 4 GPUs, lent
    to c, comes back at once, and inside c a priority-5 job takes a lower-priority job's GPU at once."""
    lower = PreemptionPolicy(within_queue="LowerPriority")
    for queues, urgent in (
        ([QueueSpec("a", guaranteed=gpus(4)), QueueSpec("c")], ("a", 4)),
        ([QueueSpec("c", preemption=lower)], ("c", 1)),
    ):
        sched = engine(queues)
        for i in range(8):
            sched.submit(Workload(f"c{i}", "c", (whole(1),), submit_time=0.0, duration=1500.0))
        sched.cycle(0.0)
        run(sched, *urgent, 1000.0, prefix="urgent", priority=5)
        gone = evicted(sched.cycle(1000.0))
        assert len(gone) == urgent[1] and all(v.startswith("c") for v in gone), (urgent, gone)


def test_fair_share_eviction_is_worth_it_from_exactly_as_much_wait_saved_as_work_lost_after_the_grace():
    """c's eight 1-GPU jobs started at 500 s; a (fair share) wants 4 GPUs at 1500 s, when each victim has run
    1000 s: 4000 GPU-seconds would be thrown away. An evicted job of c gets 600 s of grace, so evicting starts
    a at 2100 s. If c's jobs end at 3100 s (declared 2600 s), that saves a 1000 s on each of its 4 GPUs:
    exactly the work lost, which is enough; ending a second sooner, it is not. And a wait under a second is
    worth evicting work that has run less: jobs started at 999.9 s and ending at 1000.9 s (no grace) are
    evicted for a at 1000 s, saving 3.6 GPU-seconds for 0.4 thrown away; but jobs that start at 1000 s, as a
    arrives, and end when their 600 s of grace would, are not evicted to save a nothing (a second more, they are)."""
    fair = PreemptionPolicy(reclaim=False, fair_share=True)
    cases = ((500.0, 2600.0, 600.0, 1500.0, 4), (500.0, 2599.0, 600.0, 1500.0, 0), (999.9, 1.0, 0.0, 1000.0, 4))
    cases += ((1000.0, 600.0, 600.0, 1000.0, 0), (1000.0, 601.0, 600.0, 1000.0, 4))
    for start, duration, grace, now, expect in cases:
        sched = engine(
            [QueueSpec("a", preemption=fair), QueueSpec("c", preemption=PreemptionPolicy(grace_period=grace))]
        )
        for i in range(8):
            sched.submit(Workload(f"c{i}", "c", (whole(1),), submit_time=start, duration=duration))
        sched.cycle(start)
        run(sched, "a", 4, now)
        gone = evicted(sched.cycle(now))
        assert len(gone) == expect and all(v.startswith("c") for v in gone), (start, duration, gone)


def test_fair_share_victims_come_from_the_queue_furthest_above_its_share_past_usage_included():
    """a and c hold 4 GPUs each at 86,400 s (ratio 1.5 each by current usage, entitled 8/3); c (6 h usage
    half-life) ran all 8 for a day before, so with its past usage c is further above its share, as
    FairShare's order counts it. b, below its share, evicts one job for its own: c's, not a's (a's went when
    past usage subtracted there instead of added, no one was evicted at all)."""
    fair = PreemptionPolicy(reclaim=False, fair_share=True)
    sched = engine([QueueSpec("a"), QueueSpec("b", preemption=fair), QueueSpec("c", usage_half_life=21600.0)])
    _a_day_of_all_gpus(sched, "c")
    run(sched, "a", 4, 86400.0)
    run(sched, "c", 4, 86400.0)
    sched.cycle(86400.0)
    assert held(sched, "a") == held(sched, "c") == 4.0
    run(sched, "b", 1, 86410.0)
    gone = evicted(sched.cycle(86410.0))
    assert len(gone) == 1 and gone[0].startswith("c"), gone


def test_a_preempt_plugin_that_says_nothing_of_fair_share_leaves_every_queues_policy_as_written():
    """Only a Preempt plugin that says `fair_share` turns fair-share eviction on for every queue that may
    preempt (fairgpu-reclaim's Preemption); another Preempt plugin, which has no such setting, leaves the
    queues' own policies: a default policy does not evict for its fair share, one that says so does."""
    from dataclasses import replace

    class Declines:  # a Preempt plugin of someone else's, without Preemption's settings
        NAME = "Declines"

        def preempt(self, ctx: object) -> None:
            return None

    fair = PreemptionPolicy(fair_share=True)
    profile = replace(load_profile("fairgpu-reclaim"), preempt=[Declines()])
    tree = QueueTree([QueueSpec("a", preemption=PreemptionPolicy()), QueueSpec("b", preemption=fair)])
    sched = Scheduler([gpu_node("n0")], tree, profile)
    assert [q.preemption.fair_share for q in sched.tree.queues] == [False, True]
    reclaim = Scheduler([gpu_node("n0")], tree, load_profile("fairgpu-reclaim"))
    assert [q.preemption.fair_share for q in reclaim.tree.queues] == [True, True]
