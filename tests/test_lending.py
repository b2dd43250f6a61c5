"""With `borrowed: soonest-end`, capacity a queue borrows beyond its nominal share goes to its work that would
have ended first had it started when submitted, so it comes back without eviction; its own share keeps its
own order (framework/backlog.py, framework/lending.py). The default (fifo) keeps one order."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import yaml

from conftest import gpu_node, job, tree, whole
from fairgpu.catalog import load_profile, profile_from_dict
from fairgpu.errors import ProfileError
from fairgpu.framework.backlog import Backlog
from fairgpu.framework.interfaces import Profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model.queue import PreemptionPolicy, QueueSpec, QueueTree
from fairgpu.plugins.sort import FairShare


def lending() -> Profile:
    return replace(load_profile("fairgpu"), queue_sort=FairShare(borrowed="soonest-end"))


def timed(name: str, queue: str, seconds: float, t: float = 0.0, priority: int = 0):
    return replace(job(name, queue, whole(1), t=t, priority=priority), duration=seconds)


def flooded(profile: Profile) -> Scheduler:
    """a alone on 4 GPUs (its nominal share: 2), its long jobs first in its order, short ones behind."""
    s = Scheduler([gpu_node("n0", gpus=4)], tree("a", "b"), profile)
    for i in range(4):
        s.submit(timed(f"long-{i}", "a", 1000.0, t=i))
    for i in range(3):
        s.submit(timed(f"short-{i}", "a", 100.0 + i, t=10 + i))
    return s


def test_a_queue_alone_borrows_with_its_shortest_work_so_a_newcomer_waits_for_that_not_the_longest():
    s = flooded(lending())
    assert sorted(s.cycle(0).started) == ["long-0", "long-1", "short-0", "short-1"]  # own order, then lent
    s.submit(timed("b-0", "b", 50.0, t=1))
    assert s.cycle(1).started == []  # no eviction: b waits for a borrowed GPU to come back
    s.remove("short-0", finished_at=100.0)
    assert s.cycle(100).started == ["b-0"]  # at 100 s, not 1,000 s (FIFO lending: long-2 and long-3)


@pytest.mark.parametrize("profile", ["fairgpu", "kube-default"])
def test_by_default_and_under_kube_default_a_queue_borrows_in_its_own_order(profile: str):
    s = flooded(load_profile(profile))
    assert sorted(s.cycle(0).started) == ["long-0", "long-1", "long-2", "long-3"]


def test_the_setting_is_read_from_a_profile_and_a_wrong_value_names_it():
    doc = yaml.safe_load("name: p\nqueueSort: {name: FairShare, args: {borrowed: soonest-end}}")
    assert profile_from_dict(doc).queue_sort.borrowed == "soonest-end"
    doc["queueSort"]["args"]["borrowed"] = "shortest"
    with pytest.raises(ProfileError, match="borrowed: 'shortest'"):
        profile_from_dict(doc)
    with pytest.raises(ProfileError, match="borrowed"):
        profile_from_dict({"name": "p", "queueSort": {"name": "PrioritySort", "args": {"borrowed": "soonest-end"}}})


def test_a_borrowing_queues_own_share_keeps_its_order_so_long_work_is_not_starved_by_short():
    s = flooded(lending())
    s.cycle(0)
    for i in range(3, 8):
        s.submit(timed(f"short-{i}", "a", 100.0 + i, t=20 + i))
    s.remove("long-0", finished_at=1000.0)  # its own share has room: the head of its order, not a short job
    assert s.cycle(1000).started == ["long-2"]
    s.remove("short-0", finished_at=1000.0)  # lent room came back: lent again, to the shortest
    assert s.cycle(1000).started == ["short-2"]


def test_on_borrowed_capacity_priority_still_comes_before_run_time():
    s = Scheduler([gpu_node("n0", gpus=4)], tree("a", "b"), lending())
    for i in range(2):
        s.submit(timed(f"own-{i}", "a", 1000.0, t=i))
    s.submit(timed("short-low", "a", 10.0, t=5))
    s.submit(timed("long-high", "a", 5000.0, t=6, priority=5))
    s.submit(timed("mid-low", "a", 50.0, t=7))
    # own share: long-high (highest priority), then own-0; lent: the rest of priority 0, shortest first
    assert sorted(s.cycle(0).started) == ["long-high", "mid-low", "own-0", "short-low"]


@dataclass(slots=True)
class Item:
    name: str
    order: tuple[float, ...]
    lend_order: tuple[float, ...]
    user: str = ""
    share: float = 0.1


def items() -> list[Item]:
    runs = [30.0, 10.0, 20.0, 40.0]  # submitted in this order
    return [Item(f"w{i}", (0.0, i), (0.0, run, i)) for i, run in enumerate(runs)]


def test_backlog_offers_either_order_and_an_item_only_once():
    b: Backlog[Item] = Backlog(lends=True)
    w = items()
    for it in w:
        b.push(it)
    assert b.pop(lend=True).name == "w1"  # shortest
    assert b.pop().name == "w0"  # oldest
    assert b.peek().name == "w2"
    b.push(w[1])  # pushed back after an attempt: live again, once
    assert [b.pop(lend=True).name for _ in range(3)] == ["w1", "w2", "w3"]
    assert len(b) == 0
    with pytest.raises(ValueError):
        b.remove(w[0])


def test_backlog_remove_and_repeated_pushes_keep_it_small_and_exact():
    b: Backlog[Item] = Backlog(lends=True)
    w = items()
    for it in w:
        b.push(it)
    b.remove(w[1])
    assert [it.name for it in b.ordered()] == ["w0", "w2", "w3"]
    for _ in range(200):  # a cycle pops and pushes back what did not fit, again and again
        it = b.pop(lend=True)
        b.push(it)
    assert len(b) == 3 and [it.name for it in b.ordered()] == ["w0", "w2", "w3"]
    assert max(len(h) for h in (*b._own.values(), *b._lend.values())) <= 2 * 3 + 17
    assert [b.pop().name for _ in range(3)] == ["w0", "w2", "w3"]


def test_backlog_by_user_lends_within_the_least_served_users_work():
    b: Backlog[Item] = Backlog(by_user=True, lends=True)
    w = items()
    for it, user in zip(w, ("u", "u", "v", "v"), strict=True):
        it.user = user
        b.push(it)
    b.account("u", 0.5)  # u holds more: v's work goes first, its shortest on borrowed capacity
    assert b.pop(lend=True).name == "w2"
    assert b.pop().name == "w3"
    assert b.pop(lend=True).name == "w1"


def test_on_borrowed_capacity_a_long_jobs_wait_counts_so_later_short_work_does_not_pass_it_for_ever():
    s = Scheduler([gpu_node("n0", gpus=2)], tree("a", "b"), lending())
    s.submit(timed("own", "a", 1000.0, t=0))
    s.submit(timed("old-long", "a", 300.0, t=0))  # would have ended at 300
    s.submit(timed("new-short", "a", 10.0, t=400))  # would end at 410: shortest, but the long one waited
    assert sorted(s.cycle(400).started) == ["old-long", "own"]


def holding(b_starves_after: float = 600.0, long_over_share: str = "hold") -> Scheduler:
    """8 GPUs, a and b entitled to 4 each. a holds its 4; b holds 1 and waits with a 4-GPU job that does not
    fit the 3 free GPUs. Then a submits a long job (1,000 s) before a short one (300 s)."""
    queues = QueueTree([QueueSpec("a"), QueueSpec("b", starvation_after=b_starves_after)])
    profile = replace(load_profile("fairgpu"), queue_sort=FairShare(long_over_share=long_over_share))
    s = Scheduler([gpu_node("n0", gpus=8)], queues, profile)
    for i in range(4):
        s.submit(timed(f"a-{i}", "a", 1000.0))
    s.submit(timed("b-run", "b", 1000.0))
    assert sorted(s.cycle(0).started) == ["a-0", "a-1", "a-2", "a-3", "b-run"]
    s.submit(replace(job("b-big", "b", whole(4), t=1), duration=1000.0))
    s.submit(timed("a-long", "a", 1000.0, t=2))
    s.submit(timed("a-short", "a", 300.0, t=3))
    return s


def test_a_queue_at_its_share_starts_no_long_job_while_another_waits_below_its_own():
    # a-long would hold one of b's 4 entitled GPUs for 1,000 s, past b's 600 s starvation_after; a-short
    # ends before b may reserve. Work-conserving (the default), both start and b-big waits for 1,000 s.
    assert holding().cycle(4).started == ["a-short"]
    assert holding(long_over_share="start").cycle(4).started == ["a-long", "a-short"]


def test_the_limit_is_the_waiting_queues_starvation_after():
    assert holding(b_starves_after=1200.0).cycle(4).started == ["a-long", "a-short"]


@pytest.mark.parametrize(
    ("b_pods", "b_gpus", "b_runs", "a_starts"), [(1, 2, 5000.0, True), (1, 3, 500.0, False), (2, 1, 5000.0, False)]
)
def test_work_kept_off_a_starving_holders_nodes_holds_nobody_back_but_a_gang(b_pods, b_gpus, b_runs, a_starts):
    """a runs 13 of 16 GPUs, far above its share; h's 8-GPU gang starves and holds n0, which frees first
    (at 1,000 s). b, below its share, waits with a job. 2 GPUs for 5,000 s fit only n0's two free ones, which
    the hold keeps from work running past 1,000 s: b waits for the holder, not for room, and a's long 1-GPU
    job takes n1's free GPU (held back, it would only leave it idle: batch-monopoly, docs/performance.md).
    3 GPUs for 500 s may use n0 but fit nowhere: b waits for room, and a's start is held back for it. A gang of
    2 × 1 GPU for 5,000 s is kept off n0 too, but its pods must find room together outside it (n1 has one free
    GPU): it waits for room, and a's start, which would take that GPU, is held back for it."""
    queues = QueueTree([QueueSpec("a"), QueueSpec("b"), QueueSpec("h", starvation_after=0)])
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], queues, load_profile("fairgpu"))
    for name, node, gpus, end in (("a-n0", 0, 6, 1000.0), ("a-n1", 1, 7, 5000.0)):
        w = replace(job(name, "a", whole(gpus)), duration=end)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, range(gpus))], started=0.0)
    s.submit(replace(job("gang", "h", whole(8)), duration=3600.0))
    s.cycle(0)
    assert list(s.reservations["gang"].fit.nodes) == [0]
    s.submit(replace(job("b-job", "b", whole(b_gpus), pods=b_pods, t=1), duration=b_runs))
    s.submit(timed("a-long", "a", 2000.0, t=2))
    assert s.cycle(3).started == (["a-long"] if a_starts else [])


@pytest.mark.parametrize(("h_starves_after", "gang_starts"), [(0.0, True), (1e6, False)])
def test_the_starving_holders_own_start_is_never_held_back(h_starves_after, gang_starts):
    """16 GPUs. a holds 6 on n0 (A100, expected to end at 1,000 s) and 2 on n1 (H100); b holds 1, h 4 on n1, one
    free. h's 8-GPU gang (20,000 s) fits nowhere; starving at once, it holds n0 from 1,000 s. b (furthest
    below its share: tried first) then evicts its own low-priority job for a 2-GPU 100 s job only n1 can run,
    and waits the victim's 1,000 s grace: tried every cycle and fitting nowhere, b waits for room (and,
    evicting, leaves the hold to h: work that fails ahead of a holder without evicting drops its hold).
    a's job on n0 ends early, at 500 s: the gang fits now, and its start takes h above its share (12 GPUs
    against 11) for longer than b's starvation_after. Held back for b, n0 would idle for the holder, so the
    holder starts; the same gang that did not starve holds nothing and is held back."""
    queues = QueueTree(
        [
            QueueSpec("a"),
            QueueSpec(
                "b",
                starvation_after=10_000.0,
                preemption=PreemptionPolicy(within_queue="LowerPriority", grace_period=1000.0),
            ),
            QueueSpec("h", starvation_after=h_starves_after),
        ]
    )
    s = Scheduler([gpu_node("n0"), gpu_node("n1", model="H100-80GB")], queues, load_profile("fairgpu"))
    running = (("a-n0", "a", 0, range(6), 1000.0), ("a-n1", "a", 1, range(2), 5000.0))
    running += (("b-low", "b", 1, range(2, 3), 20_000.0), ("h-n1", "h", 1, range(4, 8), 20_000.0))
    for name, queue, node, cards, end in running:
        w = replace(job(name, queue, whole(len(cards))), duration=end)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, cards)], started=0.0)
    s.submit(replace(job("gang", "h", whole(8)), duration=20_000.0))
    assert s.cycle(0).started == []
    assert ("gang" in s.reservations) == gang_starts
    s.submit(replace(job("b-high", "b", whole(2, gpu_include=("H100",)), t=1, priority=1), duration=100.0))
    assert [e.workload for e in s.cycle(1).evictions] == ["b-low"]
    s.remove("a-n0", finished_at=500.0)
    assert s.cycle(500).started == (["gang"] if gang_starts else [])
