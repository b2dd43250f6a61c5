"""Dry runs into the future: when would a workload start if running work ended when it said it would?

Used to reserve nodes for a starving gang and to estimate start times in explanations. Works on a copy of
the cluster state; the real state is never touched.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from fairgpu.framework.interfaces import EngineView, Profile
from fairgpu.framework.placement import place_all
from fairgpu.model.pod import PodSpec
from fairgpu.state import scratch_key


@dataclass(slots=True, frozen=True)
class StartPlan:
    """When and where a workload would start: a dry run's answer, and what a reservation holds."""

    at: float  # when it would start
    nodes: frozenset[int]  # where
    waits_for: frozenset[str] = frozenset()  # pods of running work it expects to have left by then


@dataclass(slots=True, frozen=True)
class Planned:
    """A workload to replay: the pods still to place, and how long it runs once they all run."""

    pods: Sequence[PodSpec]
    duration: float | None


def replay(
    order: Sequence[Planned],
    view: EngineView,
    profile: Profile,
    now: float,
    ends: Iterable[tuple[float, Sequence[str]]],
    exclude: np.ndarray | None = None,
) -> StartPlan | None:
    """Place `order` one workload after another (the last is the one asked about), releasing running pods
    at their expected ends (time, pod keys) whenever the next one does not fit. A workload ahead that
    cannot fit even on the emptied cluster is passed over. None if the last one never fits. `exclude`:
    nodes none of them may use (held for other workloads)."""
    state = view.state.copy()
    dry = replace(view, state=state)
    pending = [(t, i, list(keys)) for i, (t, keys) in enumerate(ends) if math.isfinite(t)]
    heapq.heapify(pending)
    serial = len(pending)
    left: list[str] = []  # running pods released so far
    t = now
    fit: StartPlan | None = None
    for n, planned in enumerate(order):
        keys = [scratch_key("replay", n, i) for i in range(len(planned.pods))]
        gpus = sum(p.gpu.count for p in planned.pods if p.gpu is not None and state.takes_whole_cards(p.gpu))
        while True:
            enough = gpus <= state.node_idle_gpus.sum()
            placed = place_all(planned.pods, keys, dry, profile, exclude) if enough else []
            if len(placed) == len(planned.pods):
                fit = StartPlan(t, frozenset(p.node for p in placed), frozenset(left))
                break
            for key in keys[: len(placed)]:
                state.release(key)
            if not pending:
                fit = None
                break
            at, _, released = heapq.heappop(pending)
            t = max(t, at)
            for key in released:
                state.release(key)
            left += released
        if fit is not None and planned.duration is not None:
            heapq.heappush(pending, (t + planned.duration, serial, keys))
            serial += 1
    return fit
