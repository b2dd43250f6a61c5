"""Load a plugin's compiled kernels before the first decision, by running a copy of it through a tiny
cluster: the first call of any numba function pays numba's start-up (0.3 s here) and each kernel its load
from the disk cache (~10 ms), which would otherwise fall on the first placements. Running the plugin's own
code on ClusterState's own arrays, with the plugin's own settings, reaches every kernel with the argument
types real placements pass, whatever kernels the plugin has (tests/test_evaluations.py checks that
placements then load none)."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from fairgpu.framework.interfaces import EngineView, FitMask
from fairgpu.model.node import GpuDevice, NodeSpec
from fairgpu.model.pod import GpuRequest, PodSpec
from fairgpu.model.queue import QueueSpec, QueueTree
from fairgpu.state import ClusterState

_GPUS = 4
# a whole GPU, two whole GPUs, a shared GPU, CPU only: every kind of pod the plugin scores differently
_PODS = (
    PodSpec(cpu_m=4000, memory_mib=4096, gpu=GpuRequest(1, 100, 0, 100)),
    PodSpec(cpu_m=8000, memory_mib=8192, gpu=GpuRequest(2, 100, 0, 100)),
    PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, 30, 2048)),
    PodSpec(cpu_m=1000, memory_mib=1024),
)


_WARMED: set[Hashable] = set()  # what this process has loaded, by the key its plugin gave


def once(key: Hashable, warm: Callable[[], None]) -> None:
    """`warm()` the first time `key` (a plugin's kernels, with the settings that choose them) is asked for in
    this process: building a plugin loads its kernels now, not at the first decisions."""
    if key not in _WARMED:
        _WARMED.add(key)
        warm()


def _view() -> EngineView:
    """Two small nodes of four GPUs."""
    nodes = [
        NodeSpec(f"warm-{i}", 64_000, 262_144, tuple(GpuDevice("warm", 40_960, f"warm-{i}-{g}") for g in range(_GPUS)))
        for i in range(2)
    ]
    rows, share = np.zeros((1, 4)), np.zeros(1)
    tree = QueueTree([QueueSpec("warm")])
    return EngineView(ClusterState(nodes), tree, np.ones(4), rows, rows, rows, share, share, share, share)


def exercise_filter(plugin: Any) -> None:
    """Run the filter `plugin` on every pod kind, over every node and over one changed row."""
    view = _view()
    for pod in _PODS:
        for rows in (slice(None), np.array([1])):
            plugin.filter(pod, view, FitMask(np.ones(2 if isinstance(rows, slice) else 1, dtype=bool), rows=rows))


def exercise(plugin: Any) -> None:
    """Learn, score (every node and one row) and order GPUs with `plugin` (a fresh copy: it keeps what it
    learns) on two small nodes, before and after a placement changes one of them."""
    view = _view()
    state = view.state
    for step in range(2):
        for i, pod in enumerate(_PODS):
            if hasattr(plugin, "learn"):
                plugin.learn(f"warm-{i}", pod)
            plugin.generation(pod, view)
            for rows in (slice(None), np.array([1])):  # every node, and one changed row
                n = 2 if isinstance(rows, slice) else 1
                slots = np.ones((n, _GPUS), dtype=bool) if pod.gpu else None
                plugin.score(pod, view, FitMask(np.ones(n, dtype=bool), slots, rows=rows))
            if pod.gpu is not None:
                plugin.gpu_order(pod, view, 0, np.arange(_GPUS))
        if step == 0:  # the second round refreshes the changed node only
            state.assign("warm", state.placement_for(_PODS[2], 0, [1]))
