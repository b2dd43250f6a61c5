"""Mutants of the code changed since 445efb4 (FairShare's `borrowed: soonest-end`, the two-order backlog, an
elastic workload's extra pod among the victims) that the suite let live (docs/testing.md counts them;
the per-mutant record is `git show a748550:docs/testing.md`, "changed since 445efb4"): each test fails on
its mutant."""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import time
import types
from dataclasses import replace

import pytest

from conftest import gpu_node, tree, whole
from fairgpu.catalog import load_profile
from fairgpu.framework.backlog import Backlog
from fairgpu.framework.scheduler import Scheduler
from fairgpu.k8s import elector_process as ep
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


# -- k8s/elector_process.py: ElectorProcess.run() keeping an elector process running, on a clock of the test's -----


class _Clock:
    """CLOCK_MONOTONIC for elector_process, moved only by its sleeps (each also yields to the loop once)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps.append(seconds)
        await _real_sleep(0)


_real_sleep = asyncio.sleep


class _Process:
    """An elector process that lives `life` seconds once started (for ever if None); on SIGTERM it exits 0.1 s
    later, or never if it `hangs` (a stopped one)."""

    def __init__(self, clock: _Clock, log: dict[str, list[float]], life: float | None, hangs: bool) -> None:
        self.clock, self.log, self.life, self.hangs = clock, log, life, hangs
        self.ends: float | None = None
        self.exitcode: int | None = None
        self.pid = 4242

    def start(self) -> None:
        if len(self.log["start"]) >= 8:
            raise RuntimeError("restarted for ever")
        self.log["start"].append(self.clock.now)
        self.ends = None if self.life is None else self.clock.now + self.life

    def is_alive(self) -> bool:
        return self.ends is None or self.clock.now < self.ends

    def terminate(self) -> None:
        self.log["term"].append(self.clock.now)
        if not self.hangs:
            self.ends = self.clock.now + 0.1

    def kill(self) -> None:
        self.log["kill"].append(self.clock.now)
        self.ends = self.clock.now

    def join(self, timeout: float) -> None:
        pass


def _elector(monkeypatch, life: float | None = None, hangs: bool = False):
    """An ElectorProcess (lease 3 s) whose processes are _Process, on a _Clock."""
    clock = _Clock()
    log: dict[str, list[float]] = {"start": [], "term": [], "kill": []}
    monkeypatch.setattr(ep, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    fake = types.SimpleNamespace(**{k: getattr(asyncio, k) for k in dir(asyncio) if not k.startswith("__")})
    fake.sleep = clock.sleep
    monkeypatch.setattr(ep, "asyncio", fake)
    e = ep.ElectorProcess(None, "fairgpu-system", "fairgpu", "r1", 3.0, 0.25, 2.0)
    e._ctx = types.SimpleNamespace(Process=lambda **kw: _Process(clock, log, life, hangs))
    return e, clock, log


def test_an_elector_that_keeps_dying_is_restarted_two_lease_durations_later_until_its_third_death(monkeypatch, caplog):
    """docs: a dead elector is restarted two lease durations later; its third death within ten lease durations
    ends the scheduler (ElectorDied), each restart logged with its delay."""
    e, _, log = _elector(monkeypatch, life=0.0)
    with pytest.raises(ep.ElectorDied, match="died 3 times"):
        asyncio.run(e.run())
    assert [t - 1000.0 for t in log["start"]] == [0.0, 6.0, 12.0]
    assert [r.getMessage().rpartition(" ")[2] for r in caplog.records if "restarting" in r.getMessage()] == ["6s"] * 2


def test_an_elector_dying_less_often_than_three_times_in_ten_lease_durations_is_restarted_for_ever(monkeypatch):
    """Each elector lives 15 s (5 lease durations), restarted 6 s after: deaths 21 s apart, never three in 30 s."""
    e, _, log = _elector(monkeypatch, life=15.0)

    async def go() -> None:
        task = asyncio.create_task(e.run())
        while len(log["start"]) < 6:
            assert not task.done(), task
            await _real_sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    gaps = [b - a for a, b in itertools.pairwise(log["start"])]  # each death is seen at the next 50 ms poll
    assert len(gaps) == 5 and all(21.0 <= g < 21.1 for g in gaps), gaps


@pytest.mark.parametrize("hangs", [False, True])
def test_a_cancelled_run_stops_its_elector_with_sigterm_and_kills_it_only_if_it_hangs_two_seconds(monkeypatch, hangs):
    """Cancelled, run() sends SIGTERM and waits for the elector (to step down); one that has not exited within
    2 s (a stopped process) is killed. Either way run() has ended it before it returns."""
    e, clock, log = _elector(monkeypatch, hangs=hangs)

    async def go() -> float:
        task = asyncio.create_task(e.run())
        while not log["start"] or clock.now < log["start"][0] + 1.0:
            await _real_sleep(0)
        cancelled = clock.now
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return cancelled

    cancelled = asyncio.run(go())
    assert log["term"] == [cancelled] and not e.process.is_alive()
    if hangs:
        assert len(log["kill"]) == 1 and 2.0 <= log["kill"][0] - cancelled < 2.05
    else:
        assert log["kill"] == [] and clock.now - cancelled < 0.15


def test_fairgpu_runs_its_elector_process_with_the_election_timing_docs_deploy_md_states():
    """`fairgpu run --elector-in process` builds ElectorProcess with its defaults: lease 15 s > renew deadline
    10 s > retry period 2 s (as the thread's LeaderElector)."""
    s = ep.ElectorProcess(None, "fairgpu-system", "fairgpu", "A").settings
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (15.0, 10.0, 2.0)


class _Stream:
    def __init__(self, fileno: int | None) -> None:
        self._fileno = fileno

    def fileno(self) -> int:
        if self._fileno is None:
            raise io.UnsupportedOperation("no descriptor")  # pytest's capture, a StringIO
        return self._fileno

    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(("fileno", "fd"), [(1, 1), (2, 2), (5, 2), (None, 2)])
def test_the_elector_logs_to_stdout_where_its_scheduler_logs_there_and_to_stderr_otherwise(monkeypatch, fileno, fd):
    """The elector process inherits only stdout and stderr: it logs to stdout if the scheduler's log stream is
    stdout, else (stderr, a file, a stream without a descriptor) to stderr, at the scheduler's level."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [logging.StreamHandler(_Stream(fileno))])
    assert ep._log_target() == (fd, root.getEffectiveLevel())


class _Torn:
    """Shared doubles read while the elector writes: the term is `terms[0]` at the first read, `terms[1]` after."""

    def __init__(self, terms: tuple[float, float], until: float) -> None:
        self.terms, self.until, self.reads = terms, until, 0

    def __getitem__(self, i: int) -> float:
        if i == ep.UNTIL:
            return self.until
        self.reads += 1
        return self.terms[self.reads > 1]


def _following(term: int, shared_term: float, until: float, leading: bool = True):
    """An ElectorProcess whose loop knows of `term` (leading or not), its elector having published (shared_term,
    until) on CLOCK_MONOTONIC; and the list its on_lost callback appends to."""
    e = ep.ElectorProcess(None, "fairgpu-system", "fairgpu", "r1", 3.0, 0.25, 2.0)
    e.term = term
    if leading:
        e.leading.set()
    e._shared[ep.TERM], e._shared[ep.UNTIL] = shared_term, until
    lost: list[int] = []
    e.on_lost.append(lambda: lost.append(e.term))
    return e, lost


def test_the_binding_fence_is_the_published_validity_left_in_the_term_the_loop_knows_and_zero_otherwise():
    now = time.monotonic()
    e, _ = _following(1, 1, now + 2.0)
    assert 1.9 < e.remaining() <= 2.0
    assert _following(1, 1, now - 1.0)[0].remaining() == 0.0  # T passed
    assert _following(1, 2, now + 2.0)[0].remaining() == 0.0  # a term the loop has not seen begin
    assert _following(1, 1, now + 2.0, leading=False)[0].remaining() == 0.0  # the loop does not lead
    e._shared = _Torn((1, 2), now + 2.0)  # the elector began a term between the reads
    assert e.remaining() == 0.0


def test_the_loop_follows_the_published_terms_and_tells_of_each_end_once():
    now = time.monotonic()
    e, lost = _following(1, 1, now + 2.0)
    e._look()  # nothing changed: still leading, nothing lost
    assert e.leading.is_set() and e.term == 1 and lost == []
    e._shared[ep.TERM] = 2  # stepped down and began a new term between two looks
    e._look()
    assert e.leading.is_set() and e.term == 2 and lost == [1]
    e._shared[ep.UNTIL] = now - 1.0  # not renewed in time
    e._look()
    assert not e.leading.is_set() and lost == [1, 2]
    e._look()  # not held, not leading: nothing happens
    assert not e.leading.is_set() and lost == [1, 2]
