"""Fairness, utilization and wait metrics of a simulated run (design/metrics.md, "Fairness").

The cluster is piecewise constant between events, so every time-average here is an exact integral over
those intervals rather than a sampled estimate. Every queue of the tree is recorded (an inner queue holds
what its children hold); fairness_error and the Jain index are over leaf queues, where workloads live.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fairgpu import resources as r
from fairgpu.framework.idle import CAUSES
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model.queue import QueueTree


@dataclass(slots=True)
class Timeline:
    """Per-event samples, each holding until the next: shares are dominant shares of the cluster."""

    t: list[float] = field(default_factory=list)
    share: list[np.ndarray] = field(default_factory=list)  # (Q,)
    entitled: list[np.ndarray] = field(default_factory=list)  # (Q,)
    gpus: list[np.ndarray] = field(default_factory=list)  # (Q,) GPU-equivalents held
    entitled_gpus: list[np.ndarray] = field(default_factory=list)  # (Q,) GPU-equivalents entitled
    backlogged: list[np.ndarray] = field(default_factory=list)  # (Q,) bool
    allocated_gpus: list[float] = field(default_factory=list)
    idle_gpus: list[np.ndarray] = field(default_factory=list)  # (C,) idle GPU-equivalents by cause (idle.CAUSES)

    def window_gpu_seconds(self, start: float, end: float, series: str = "gpus") -> np.ndarray:
        """(Q,) GPU-seconds each queue held (or, with series="entitled_gpus", was entitled to) in
        [start, end)."""
        values = getattr(self, series)
        out = np.zeros(len(values[0])) if values else np.zeros(0)
        for i, t0 in enumerate(self.t):
            t1 = self.t[i + 1] if i + 1 < len(self.t) else end
            lo, hi = max(t0, start), min(t1, end)
            if hi > lo:
                out += values[i] * (hi - lo)
        return out


@dataclass(slots=True)
class MetricsRecorder:
    """Feed it `sample(t, scheduler)` after each event's cycle and `close(horizon)` at the end."""

    tree: QueueTree
    timeline: Timeline = field(default_factory=Timeline)
    _t: float | None = None
    _state: tuple | None = None
    gpu_seconds: np.ndarray = field(init=False)
    entitled_gpu_seconds: np.ndarray = field(init=False)
    share_seconds: np.ndarray = field(init=False)
    entitled_seconds: np.ndarray = field(init=False)
    # per queue: its GPU-seconds, and all queues' GPU-seconds, while some *other* leaf queue was backlogged
    while_others_wait_gpu_seconds: np.ndarray = field(init=False)
    while_others_wait_total_seconds: np.ndarray = field(init=False)
    backlogged_seconds: np.ndarray = field(init=False)
    error_seconds: float = 0.0
    jain_seconds: float = 0.0
    jain_time: float = 0.0
    allocated_gpu_seconds: float = 0.0
    capacity_gpu_seconds: float = 0.0  # the inventory's GPUs over time (a recorded trace's nodes change)
    idle_gpu_seconds: np.ndarray = field(default_factory=lambda: np.zeros(len(CAUSES)))  # by cause: sums to idle
    # time_to_fair_share: per queue, when its current backlogged episode began (None: none open)
    _open_since: list[float | None] = field(init=False)
    _was_backlogged: np.ndarray = field(init=False)
    _reached: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.tree)
        for name in (
            "gpu_seconds",
            "entitled_gpu_seconds",
            "share_seconds",
            "entitled_seconds",
            "while_others_wait_gpu_seconds",
            "while_others_wait_total_seconds",
            "backlogged_seconds",
        ):
            setattr(self, name, np.zeros(n))
        self._open_since = [None] * n
        self._was_backlogged = np.zeros(n, dtype=bool)

    def sample(self, t: float, sched: Scheduler) -> None:
        self._advance(t)
        v, tree = sched.view, self.tree
        # The engine's queues, when they changed since the start, are some of the run's: map them over.
        at = None if sched.tree is tree else np.array([tree.index[n] for n in sched.tree.names()], dtype=np.int64)

        def mine(a: np.ndarray) -> np.ndarray:
            if at is None:
                return a.copy()
            out = np.zeros(len(tree), dtype=a.dtype)
            out[at] = a
            return out

        backlogged = tree.rollup(mine(sched.is_backlogged()))  # an inner queue is backlogged when a child is
        usage, entitled = mine(v.usage_dom), mine(v.entitled_dom)
        gpus, allocated = mine(v.usage[:, r.DIM_GPU]), sched.state.allocated_gpu_equivalents()
        entitled_gpus = mine(v.entitled[:, r.DIM_GPU])
        idle = np.fromiter(sched.idle_gpus(t).values(), dtype=np.float64, count=len(CAUSES))
        state = (usage, entitled, gpus, entitled_gpus, backlogged, allocated, idle, sched.state.total_gpus)
        self._state = state
        tl = self.timeline
        series: tuple[list[Any], ...] = (
            tl.t, tl.share, tl.entitled, tl.gpus, tl.entitled_gpus, tl.backlogged, tl.allocated_gpus, tl.idle_gpus
        )  # fmt: skip
        if tl.t and tl.t[-1] == t:  # several cycles at one instant: the last one holds
            for values in series:
                values.pop()
        for values, value in zip(series, (t, *state[:-1]), strict=True):
            values.append(value)
        for q in np.flatnonzero(backlogged & ~self._was_backlogged & tree.is_leaf):
            self._open_since[q] = t
        for i, since in enumerate(self._open_since):
            # Reached at 90 % of the entitlement, or when nothing of it waits any more.
            if since is not None and (usage[i] >= 0.9 * entitled[i] - 1e-12 or not backlogged[i]):
                self._reached.append(t - since)
                self._open_since[i] = None
        self._was_backlogged = backlogged

    def _advance(self, t: float) -> None:
        if self._t is not None and self._state is not None and t > self._t:
            dt = t - self._t
            usage, entitled, gpus, entitled_gpus, backlogged, allocated, idle, total = self._state
            leaf = self.tree.is_leaf
            self.gpu_seconds += gpus * dt
            self.entitled_gpu_seconds += entitled_gpus * dt
            self.share_seconds += usage * dt
            self.entitled_seconds += entitled * dt
            self.backlogged_seconds += backlogged * dt
            self.error_seconds += 0.5 * float(np.abs(usage - entitled)[leaf].sum()) * dt
            self.allocated_gpu_seconds += allocated * dt
            self.capacity_gpu_seconds += total * dt
            self.idle_gpu_seconds += idle * dt
            contenders = backlogged & leaf & (entitled > 0)
            if contenders.sum() >= 2:
                x = usage[contenders] / entitled[contenders]
                denom = len(x) * float((x * x).sum())
                self.jain_seconds += (float(x.sum()) ** 2 / denom if denom > 0 else 0.0) * dt
                self.jain_time += dt
            waiting = (backlogged & leaf).astype(np.int64)
            for i in reversed(range(len(waiting))):  # waiting leaves within each subtree
                if self.tree.parent[i] >= 0:
                    waiting[self.tree.parent[i]] += waiting[i]
            others_wait = (int((backlogged & leaf).sum()) - waiting) > 0
            self.while_others_wait_gpu_seconds += np.where(others_wait, gpus, 0.0) * dt
            self.while_others_wait_total_seconds += np.where(others_wait, float(gpus[leaf].sum()), 0.0) * dt
        self._t = t if self._t is None else max(self._t, t)

    def close(self, horizon: float) -> None:
        self._advance(horizon)

    def time_to_fair_share(self) -> dict[str, float | int | None]:
        """Median and max seconds from a leaf queue becoming backlogged to holding 90 % of its entitlement."""
        reached = self._reached
        return {
            "median": float(np.median(reached)) if reached else None,
            "max": float(np.max(reached)) if reached else None,
            "episodes": len(reached),
            "not_reached": sum(since is not None for since in self._open_since),
        }
