"""Dry runs into the future: when would a workload fit if running work ended when it said it would?

Used to reserve nodes for a starving gang and to estimate start times in explanations. Works on a copy of
the cluster state; the real state is never touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import groupby

from fairgpu.framework.interfaces import EngineView
from fairgpu.framework.placement import place_all
from fairgpu.framework.profile import Profile
from fairgpu.model.pod import PodSpec


@dataclass(slots=True, frozen=True)
class Fit:
    at: float  # when it would fit
    nodes: frozenset[int]  # where


def earliest_fit(
    pods: Sequence[PodSpec],
    view: EngineView,
    profile: Profile,
    now: float,
    ends: Iterable[tuple[float, Sequence[str]]],
) -> Fit | None:
    """Release running pods in order of expected end (time, pod keys) until all `pods` fit together."""
    state = view.state.copy()
    dry = replace(view, state=state)
    keys = [f"\0dry-run-{i}" for i in range(len(pods))]
    gpus_needed = sum(p.gpu.count for p in pods if p.gpu is not None and p.gpu.exclusive)

    def attempt() -> frozenset[int] | None:
        if gpus_needed > int(state.node_idle_gpus.sum()):
            return None  # cannot fit yet: not enough idle GPUs in the whole cluster
        placed = place_all(pods, keys, dry, profile)
        for key in keys[: len(placed)]:
            state.release(key)
        return frozenset(p.node for p in placed) if len(placed) == len(pods) else None

    nodes = attempt()
    if nodes is not None:
        return Fit(now, nodes)
    for at, group in groupby(sorted(ends, key=lambda e: e[0]), key=lambda e: e[0]):
        for _, pod_keys in group:
            for key in pod_keys:
                state.release(key)
        nodes = attempt()
        if nodes is not None:
            return Fit(max(at, now), nodes)
    return None
