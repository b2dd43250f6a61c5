"""The discrete-event simulator: submit, start and finish events, every decision made by the engine."""

from __future__ import annotations

import heapq
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from fairgpu.errors import ScenarioError
from fairgpu.framework.idle import CAUSES
from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import CycleObserver, Scheduler
from fairgpu.model.pod import Workload
from fairgpu.sim.metrics import MetricsRecorder, Timeline
from fairgpu.sim.scenario import Scenario

# At one instant: finishes and evictions free capacity before new work arrives.
_FINISH, _EVICTED, _SUBMIT = 0, 1, 2
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
        self.tree = scenario.tree()
        self.sched = Scheduler(scenario.nodes, self.tree, profile)
        self._idle_empty = self.sched.idle_gpus(0.0)  # read before anything is submitted
        self.by_name = {w.name: w for w in scenario.workloads}
        # (time, kind, seq, workload, run or evicted pods): kinds order what happens at one instant
        self._events: list[tuple[float, int, int, str, object]] = [
            (w.submit_time, _SUBMIT, seq, w.name, None)
            for seq, w in enumerate(scenario.workloads)
            if w.submit_time <= self.horizon
        ]
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

    def _push(self, t: float, kind: int, name: str, payload: object) -> None:
        heapq.heappush(self._events, (t, kind, self._seq, name, payload))
        self._seq += 1

    def run_until(self, t: float) -> None:
        """Process every event up to time t (and the horizon), running a cycle after each instant."""
        events, sched = self._events, self.sched
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
                    sched.submit(self._declared(name))
                elif kind == _FINISH:
                    if sched.state_of(name) == "running" and payload == self._run[name]:
                        sched.remove(name, finished_at=now)
                        self.completed[self.by_name[name].queue] += 1
                else:
                    self._evicted(now, name, payload)
            self._cycle(now)
            self.rec.sample(now, sched)

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
            self._push(ev.at, _EVICTED, ev.workload, (self._run[ev.workload], ev.pods))

    def _evicted(self, now: float, name: str, payload: object) -> None:
        run, pods = cast(tuple[int, tuple[int, ...] | None], payload)
        if self.sched.state_of(name) != "running" or run != self._run[name]:
            return  # it finished on its own during the grace period
        wl, placed = self.by_name[name], self.sched.status(name).placed
        self.preempted[wl.queue] += 1
        self.evicted[name] += 1
        self.eviction_log.append((now, name, wl.queue))
        if pods is not None:  # an elastic workload gives back extra pods and keeps running
            self.sched.shrink(name, pods)
            return
        held = sum(p.gpu.gpu_equivalents() for p in wl.pods[:placed] if p.gpu is not None)
        self.lost_gpu_seconds[wl.queue] += held * (now - self.starts[name])  # no checkpoint: all of it
        self.sched.remove(name)
        self.starts.pop(name, None)
        self.sched.submit(self._declared(name))

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
        capacity = self.sched.state.total_gpus * horizon
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
            state = self.sched.state_of(wl.name) or "finished"
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
