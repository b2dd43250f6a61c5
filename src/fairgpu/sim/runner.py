"""The discrete-event simulator: submit, start and finish events, and a recorded trace's node and queue
changes; every decision made by the engine."""

from __future__ import annotations

import heapq
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from fairgpu.errors import RequestError, ScenarioError
from fairgpu.framework.idle import CAUSES
from fairgpu.framework.profile import Profile
from fairgpu.framework.reconfigure import carry_over, successor
from fairgpu.framework.scheduler import CycleObserver, Scheduler
from fairgpu.model.pod import Workload
from fairgpu.model.queue import QueueTree
from fairgpu.sim.metrics import MetricsRecorder, Timeline
from fairgpu.sim.scenario import Change, Scenario

# At one instant: the cluster changes, then finishes and evictions free capacity before new work arrives.
_CHANGE, _FINISH, _EVICTED, _SUBMIT, _RETRY = 0, 1, 2, 3, 4
MAX_CYCLES_PER_INSTANT = 64  # grace-0 evictions cycle again at the same instant; preemption must settle


@dataclass(slots=True)
class SimResult:
    scenario: str
    profile: str
    horizon_s: float
    utilization: float
    fairness_error: float
    jain_index: float | None
    jain_window_s: float  # the time jain_index averages over: at least two leaf queues backlogged
    evictions: int
    time_to_fair_share_s: dict[str, Any]
    queues: dict[str, dict[str, Any]]
    idle_gpu_hours: dict[str, float] = field(default_factory=dict)  # by cause (framework/idle.py): sums to idle
    cycles: int = 0
    starts: dict[str, float] = field(default_factory=dict)  # workload → start time
    timeline: Timeline = field(default_factory=Timeline)
    workloads: list[dict[str, Any]] = field(default_factory=list)  # one row per submitted workload
    eviction_log: list[tuple[float, str, str]] = field(default_factory=list)  # (time, workload, queue)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "profile": self.profile,
            "horizon_s": self.horizon_s,
            "utilization": self.utilization,
            "fairness_error": self.fairness_error,
            "jain_index": self.jain_index,
            "jain_window_s": self.jain_window_s,
            "evictions": self.evictions,
            "idle_gpu_hours": self.idle_gpu_hours,
            "time_to_fair_share_s": self.time_to_fair_share_s,
            "cycles": self.cycles,
            "queues": self.queues,
        }


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


class Simulation:
    """One scenario under one profile, advanced event by event."""

    def __init__(
        self, scenario: Scenario, profile: Profile, horizon: float | None = None, declared_durations: bool = True
    ) -> None:
        """`declared_durations` False: the engine is not told how long workloads run (as on a cluster whose
        pods carry no expected-runtime annotation) and learns it per queue; they still end when they end."""
        self.scenario = scenario
        self.declared_durations = declared_durations
        self.profile = profile
        self.horizon = scenario.horizon if horizon is None else horizon
        if not self.horizon > 0:  # every figure is a time average over it
            raise ScenarioError(f"{scenario.name}: the horizon must be positive (it spans no time)")
        self.tree = scenario.report_tree()  # every queue the run ever has (the engine's may change)
        self.sched = Scheduler(scenario.nodes, scenario.tree(), profile)
        self._idle_empty = self.sched.idle_gpus(0.0)  # read before anything is submitted
        self._total_gpus_at_start = self.sched.state.total_gpus
        self.by_name = {w.name: w for w in scenario.workloads}
        # (time, kind, seq, workload, run or evicted pods or change): kinds order what happens at one instant
        self._events: list[tuple[float, int, int, str, object]] = [
            (w.submit_time, _SUBMIT, seq, w.name, None)
            for seq, w in enumerate(scenario.workloads)
            if w.submit_time <= self.horizon
        ]
        self._events += [(c.t, _CHANGE, -1 - i, "", c) for i, c in enumerate(scenario.changes) if c.t <= self.horizon]
        heapq.heapify(self._events)
        self._seq = len(self._events)
        self._run: Counter[str] = Counter()  # how many times each workload started: stale finishes are dropped
        self.rec = MetricsRecorder(self.tree)
        self.starts: dict[str, float] = {}
        self.completed: Counter[str] = Counter()
        self.preempted: Counter[str] = Counter()
        self.first_starts: dict[str, float] = {}
        self.evicted: Counter[str] = Counter()  # per workload
        self.eviction_log: list[tuple[float, str, str]] = []
        self.lost_gpu_seconds: defaultdict[str, float] = defaultdict(float)
        self.cycles = 0
        self.observer: CycleObserver | None = None
        self._pinned: dict[str, tuple[Workload, float]] = {}  # running, their queue deleted: held where they run
        self._orphans: dict[str, Workload] = {}  # waiting for their queue to exist (again)
        self._decided: Counter[str] = Counter()  # whole-workload evictions decided so far, per workload

    def _push(self, t: float, kind: int, name: str, payload: object) -> None:
        heapq.heappush(self._events, (t, kind, self._seq, name, payload))
        self._seq += 1

    def run_until(self, t: float) -> None:
        """Process every event up to time t (and the horizon), running a cycle after each instant."""
        events = self._events
        cycles_now, last = 0, None
        while events and events[0][0] <= min(t, self.horizon):
            now = events[0][0]
            cycles_now = cycles_now + 1 if now == last else 1
            if cycles_now > MAX_CYCLES_PER_INSTANT:
                raise RuntimeError(f"t={now:g}s: evictions did not settle after {MAX_CYCLES_PER_INSTANT} cycles")
            last = now
            while events and events[0][0] == now:
                _, kind, _, name, payload = heapq.heappop(events)
                if kind == _SUBMIT:
                    self._submit(self._declared(name))
                elif kind == _FINISH:
                    self._finished(now, name, payload)
                elif kind == _EVICTED:
                    self._evicted(now, name, payload)
                elif kind == _CHANGE:
                    self._reconfigure(now, cast(Change, payload))
            self._cycle(now)
            self.rec.sample(now, self.sched)

    def _submit(self, wl: Workload) -> None:
        """Into the engine; with a recorded trace's changes, work whose queue does not exist (any more) or
        that no node can hold now waits outside until a change lets it in, as its pods wait on a cluster."""
        qi = self.sched.tree.index.get(wl.queue)
        if self.scenario.changes and (qi is None or not self.sched.tree.is_leaf[qi]):
            self._orphans[wl.name] = wl
            return
        try:
            self.sched.submit(wl)
        except RequestError:
            if not self.scenario.changes:
                raise
            self._orphans[wl.name] = wl

    def _finished(self, now: float, name: str, run: object) -> None:
        if run != self._run[name]:
            return  # a finish of an earlier run, evicted since
        if self.sched.state_of(name) == "running":
            self.sched.remove(name, finished_at=now)
            self.completed[self.by_name[name].queue] += 1
        elif (pinned := self._pinned.pop(name, None)) is not None:
            wl = pinned[0]
            for key in wl.pod_names:
                self.sched.state.release(key)
            self.completed[wl.queue] += 1
            self.starts.pop(name, None)

    def _reconfigure(self, now: float, change: Change) -> None:
        """A node or queue change of a recorded trace: a new engine (framework/reconfigure.py); work that
        lost its node is evicted and requeued, as a cluster's controllers recreate its pods."""
        old = self.sched
        nodes = old.state.nodes if change.nodes is None else change.nodes
        tree = old.tree if change.queues is None else QueueTree(change.queues)
        new = successor(old, nodes, tree, now)
        held = {name: self._held_gpus(name, old) for name in (*old.running, *self._pinned)}
        carried = carry_over(old, new, self._pinned)
        self.sched, self._pinned = new, carried.pinned
        for name in carried.displaced:
            self._lost(now, name, held[name])
        waiting = [*carried.orphaned, *self._orphans.values()]
        self._orphans = {}
        for wl in sorted(waiting, key=lambda w: w.submit_time):
            self._submit(wl)

    def _cycle(self, now: float) -> None:
        began = time.perf_counter()
        result = self.sched.cycle(now)
        self.cycles += 1
        if self.observer is not None:
            self.observer.on_cycle(self.sched, result, now, time.perf_counter() - began)
        for name in result.started:
            self.starts[name] = now
            self.first_starts.setdefault(name, now)
            self._run[name] += 1
            duration = self.by_name[name].duration
            if duration is not None:
                self._push(now + duration, _FINISH, name, self._run[name])
        for ev in result.evictions:  # carried out when the grace period ends (at once when it is 0)
            if ev.pods is None and (backoff := self._refused(ev.workload)) is not None:
                self.sched.eviction_refused(ev.workload, now + backoff)
                self._push(now, _RETRY, "", None)  # the preemptor looks for other room, as a controller does
                continue
            self._push(ev.at, _EVICTED, ev.workload, (self._run[ev.workload], ev.pods))

    def _refused(self, name: str) -> float | None:
        """The back-off of this eviction if the recorded cluster refused it (the same one in turn)."""
        n = self._decided[name]
        self._decided[name] += 1
        plan = self.scenario.refusals.get(name, ())
        return plan[n] if n < len(plan) else None

    def _evicted(self, now: float, name: str, payload: object) -> None:
        run, pods = cast(tuple[int, tuple[int, ...] | None], payload)
        if self.sched.state_of(name) != "running" or run != self._run[name]:
            return  # it finished on its own during the grace period
        if pods is not None:  # an elastic workload gives back extra pods and keeps running
            self._count_eviction(now, name)
            self.sched.shrink(name, pods, regrow=not self.scenario.recreated)
            return
        held = self._held_gpus(name, self.sched)
        self.sched.remove(name)
        self._lost(now, name, held)

    def _held_gpus(self, name: str, sched: Scheduler) -> float:
        wl = self._pinned[name][0] if name in self._pinned else sched.workload(name)
        placed = len(wl.pods) if name in self._pinned else sched.status(name).placed
        return sum(p.gpu.gpu_equivalents() for p in wl.pods[:placed] if p.gpu is not None)

    def _count_eviction(self, now: float, name: str) -> None:
        queue = self.by_name[name].queue
        self.preempted[queue] += 1
        self.evicted[name] += 1
        self.eviction_log.append((now, name, queue))

    def _lost(self, now: float, name: str, held: float) -> None:
        """A running workload stopped before its end (evicted, or its node is gone): requeued, as the
        cluster's controllers recreate its pods; what it ran is lost (no checkpoint)."""
        self._count_eviction(now, name)
        self.lost_gpu_seconds[self.by_name[name].queue] += held * (now - self.starts[name])
        self.starts.pop(name, None)
        wl = self._declared(name)
        self._submit(replace(wl, submit_time=now) if self.scenario.recreated else wl)

    def _declared(self, name: str) -> Workload:
        """The workload as the engine is told of it."""
        wl = self.by_name[name]
        return wl if self.declared_durations else replace(wl, duration=None)

    def run(self) -> SimResult:
        """Run to the horizon and report."""
        self.run_until(self.horizon)
        horizon, rec = self.horizon, self.rec
        rec.close(horizon)
        # Before the first event the cluster is empty and nothing is pending: idle for that reason.
        before = min(rec.timeline.t[0], horizon) if rec.timeline.t else horizon
        idle_s = rec.idle_gpu_seconds + before * np.fromiter(self._idle_empty.values(), dtype=np.float64)
        tree = self.tree
        waits: list[list[float]] = [[] for _ in tree.queues]
        for wl in self.scenario.workloads:
            if wl.submit_time <= horizon:
                # A workload still waiting at the horizon counts with the wait it has had so far.
                waits[tree.index[wl.queue]].append(self.starts.get(wl.name, horizon) - wl.submit_time)
        started = Counter(self.by_name[name].queue for name in self.starts)
        ever = Counter(self.by_name[name].queue for name in self.first_starts)
        counts = np.array(
            [[started[q], self.completed[q], self.preempted[q], ever[q]] for q in tree.names()], dtype=np.int64
        ).reshape(len(tree), 4)
        lost = np.array([self.lost_gpu_seconds[q] for q in tree.names()], dtype=np.float64)
        for values in (waits, counts, lost):  # an inner queue reports what its subtree did
            tree.rollup(values)
        hours = 3600.0
        queues: dict[str, dict[str, Any]] = {}
        for i, spec in enumerate(tree.queues):
            w = waits[i]
            others = rec.while_others_wait_total_seconds[i]
            queues[spec.name] = {
                "parent": spec.parent,
                "gpu_hours": float(rec.gpu_seconds[i] / hours),
                "entitled_gpu_hours": float(rec.entitled_gpu_seconds[i] / hours),
                "mean_share": float(rec.share_seconds[i] / horizon),
                "mean_entitled": float(rec.entitled_seconds[i] / horizon),
                "share_while_others_wait": float(rec.while_others_wait_gpu_seconds[i] / others) if others else None,
                "backlogged_s": float(rec.backlogged_seconds[i]),
                "wait_p50_s": _percentile(w, 50),
                "wait_p95_s": _percentile(w, 95),
                "wait_max_s": max(w) if w else None,
                "submitted": len(w),
                "started": int(counts[i, 0]),
                "completed": int(counts[i, 1]),
                "preempted": int(counts[i, 2]),
                "never_started": len(w) - int(counts[i, 3]),
                "lost_gpu_hours": float(lost[i] / hours),
            }
        capacity = rec.capacity_gpu_seconds + before * self._total_gpus_at_start
        return SimResult(
            scenario=self.scenario.name,
            profile=self.profile.name,
            horizon_s=horizon,
            utilization=float(rec.allocated_gpu_seconds / capacity) if capacity else 0.0,
            fairness_error=float(rec.error_seconds / horizon),
            jain_index=float(rec.jain_seconds / rec.jain_time) if rec.jain_time else None,
            jain_window_s=float(rec.jain_time),
            evictions=sum(self.preempted.values()),
            time_to_fair_share_s=rec.time_to_fair_share(),
            queues=queues,
            idle_gpu_hours={c: float(s / hours) for c, s in zip(CAUSES, idle_s, strict=True)},
            cycles=self.cycles,
            starts=dict(self.starts),
            timeline=rec.timeline,
            workloads=self._workload_rows(),
            eviction_log=list(self.eviction_log),
        )

    def _workload_rows(self) -> list[dict[str, Any]]:
        """What happened to each workload submitted before the horizon, for export and the report."""
        rows = []
        for wl in self.scenario.workloads:
            if wl.submit_time > self.horizon:
                continue
            first = self.first_starts.get(wl.name)
            state = self.sched.state_of(wl.name) or (
                "running" if wl.name in self._pinned else "pending" if wl.name in self._orphans else "finished"
            )
            if state == "pending" and first is not None:
                state = "requeued"  # evicted, waiting to run again
            rows.append({
                "workload": wl.name, "queue": wl.queue, "user": wl.user, "pods": len(wl.pods),
                "submitted_s": wl.submit_time, "first_start_s": first,
                "wait_s": (first if first is not None else self.horizon) - wl.submit_time,
                "evictions": self.evicted[wl.name], "state": state,
            })  # fmt: skip
        return rows


def simulate(
    scenario: Scenario, profile: Profile, horizon: float | None = None, declared_durations: bool = True
) -> SimResult:
    return Simulation(scenario, profile, horizon, declared_durations).run()
