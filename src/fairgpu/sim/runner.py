"""The discrete-event simulator: submit, start and finish events, every decision made by the engine."""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.sim.metrics import MetricsRecorder
from fairgpu.sim.scenario import Scenario

_FINISH, _SUBMIT = 0, 1  # at equal times, finishes free capacity before new work arrives


@dataclass(slots=True)
class SimResult:
    scenario: str
    profile: str
    horizon_s: float
    utilization: float
    fairness_error: float
    jain_index: float | None
    evictions: int
    time_to_fair_share_s: dict[str, Any]
    queues: dict[str, dict[str, Any]]
    cycles: int = 0
    starts: dict[str, float] = field(default_factory=dict)  # workload → start time

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "profile": self.profile,
            "horizon_s": self.horizon_s,
            "utilization": self.utilization,
            "fairness_error": self.fairness_error,
            "jain_index": self.jain_index,
            "evictions": self.evictions,
            "time_to_fair_share_s": self.time_to_fair_share_s,
            "cycles": self.cycles,
            "queues": self.queues,
        }


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def simulate(scenario: Scenario, profile: Profile, horizon: float | None = None) -> SimResult:
    horizon = scenario.horizon if horizon is None else horizon
    tree = scenario.tree()
    sched = Scheduler(scenario.nodes, tree, profile)
    by_name = {w.name: w for w in scenario.workloads}
    events: list[tuple[float, int, int, str]] = []
    for seq, wl in enumerate(scenario.workloads):
        if wl.submit_time <= horizon:
            events.append((wl.submit_time, _SUBMIT, seq, wl.name))
    heapq.heapify(events)
    seq = len(events)
    rec = MetricsRecorder(tree.leaves, [tree.queues[i].name for i in tree.leaves], sched.state.total_gpus)
    starts: dict[str, float] = {}
    completed: dict[str, int] = {name: 0 for name in tree.names()}
    cycles = 0
    while events and events[0][0] <= horizon:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, _, name = heapq.heappop(events)
            if kind == _SUBMIT:
                sched.submit(by_name[name])
            else:
                sched.remove(name)
                completed[by_name[name].queue] += 1
        result = sched.cycle(now)
        cycles += 1
        for name in result.started:
            starts[name] = now
            duration = by_name[name].duration
            if duration is not None:
                heapq.heappush(events, (now + duration, _FINISH, seq, name))
                seq += 1
        rec.sample(now, sched)
    rec.close(horizon)

    waits: dict[str, list[float]] = {name: [] for name in tree.names()}
    for wl in scenario.workloads:
        if wl.submit_time <= horizon:
            # A workload still waiting at the horizon counts with the wait it has had so far.
            waits[wl.queue].append(starts.get(wl.name, horizon) - wl.submit_time)
    started = Counter(by_name[name].queue for name in starts)
    hours = 3600.0
    queues: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(rec.names):
        w = waits[name]
        queues[name] = {
            "gpu_hours": float(rec.gpu_seconds[i] / hours),
            "entitled_gpu_hours": float(rec.entitled_gpu_seconds[i] / hours),
            "mean_share": float(rec.share_seconds[i] / horizon),
            "mean_entitled": float(rec.entitled_seconds[i] / horizon),
            "share_while_others_wait": (
                float(rec.while_others_wait_gpu_seconds[i] / rec.while_others_wait_total_seconds[i])
                if rec.while_others_wait_total_seconds[i] > 0
                else None
            ),
            "backlogged_s": float(rec.backlogged_seconds[i]),
            "wait_p50_s": _percentile(w, 50),
            "wait_p95_s": _percentile(w, 95),
            "wait_max_s": max(w) if w else None,
            "submitted": len(w),
            "started": started[name],
            "completed": completed[name],
            "preempted": 0,
        }
    capacity = sched.state.total_gpus * horizon
    return SimResult(
        scenario=scenario.name,
        profile=profile.name,
        horizon_s=horizon,
        utilization=float(rec.allocated_gpu_seconds / capacity) if capacity else 0.0,
        fairness_error=float(rec.error_seconds / horizon),
        jain_index=float(rec.jain_seconds / rec.jain_time) if rec.jain_time else None,
        evictions=0,
        time_to_fair_share_s=rec.time_to_fair_share(),
        queues=queues,
        cycles=cycles,
        starts=starts,
    )
