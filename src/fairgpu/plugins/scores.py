"""Score plugins: which feasible node, and which GPUs on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairgpu.framework.interfaces import EngineView, FitMask, NodeLocal
from fairgpu.model.pod import PodSpec

_NODE_RESOURCES = ("cpu", "memory", "gpu")


def _free_after(pod: PodSpec, view: EngineView, resource: str, r: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
    """(free after placing the pod, capacity) per node of rows `r` for one resource."""
    st = view.state
    if resource == "cpu":
        return st.cpu_free[r] - pod.cpu_m, st.cpu_cap[r]
    if resource == "memory":
        return st.mem_free[r] - pod.memory_mib, st.mem_cap[r]
    taken = pod.gpu.count * pod.gpu.cores if pod.gpu is not None else 0
    return st.node_cores_free[r] - taken, st.node_cores_cap[r]


def _free_fraction(pod: PodSpec, view: EngineView, resources: tuple[str, ...], mask: FitMask) -> np.ndarray:
    total = np.zeros(len(mask.nodes))
    for res in resources:
        free, cap = _free_after(pod, view, res, mask.rows)
        total += np.divide(free, cap, out=np.zeros(len(cap)), where=cap > 0)
    return total / len(resources)


@dataclass(slots=True)
class LeastAllocated(NodeLocal):
    """kube-scheduler's NodeResourcesFit LeastAllocated: prefer the emptiest node (cpu and memory by
    default, the scheduler's own default scoring resources); GPUs are taken in device order, as the
    device plugin hands them out."""

    NAME: ClassVar[str] = "LeastAllocated"

    resources: tuple[str, ...] = ("cpu", "memory")

    def __post_init__(self) -> None:
        self.resources = tuple(self.resources)
        bad = [x for x in self.resources if x not in _NODE_RESOURCES]
        if bad or not self.resources:
            raise ValueError(f"resources must be a non-empty subset of {_NODE_RESOURCES}, got {bad}")

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        return 100.0 * _free_fraction(pod, view, self.resources, mask)

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray:
        return slots


@dataclass(slots=True)
class Binpack(NodeLocal):
    """Fill the fullest node first (GPU cores for GPU pods, cpu and memory otherwise), and on it the
    fullest GPUs that fit, so whole GPUs and whole nodes stay free for larger requests."""

    NAME: ClassVar[str] = "Binpack"

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        resources = ("gpu",) if pod.gpu is not None else ("cpu", "memory")
        return 100.0 * (1.0 - _free_fraction(pod, view, resources, mask))

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray:
        st = view.state
        order = np.lexsort((st.gpu_mem_free[node, slots], st.gpu_cores_free[node, slots]))
        return slots[order]


@dataclass(slots=True)
class Spread(NodeLocal):
    """The emptiest node first (GPU cores for GPU pods, cpu and memory otherwise), and on it the emptiest
    GPUs, so co-located pods contend the least."""

    NAME: ClassVar[str] = "Spread"

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        resources = ("gpu",) if pod.gpu is not None else ("cpu", "memory")
        return 100.0 * _free_fraction(pod, view, resources, mask)

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray:
        st = view.state
        order = np.lexsort((-st.gpu_mem_free[node, slots], -st.gpu_cores_free[node, slots]))
        return slots[order]


_POLICIES: dict[str, Binpack | Spread] = {"binpack": Binpack(), "spread": Spread()}


@dataclass(slots=True)
class PodPolicy(NodeLocal):
    """HAMi's per-pod annotation hami.io/node-scheduler-policy (binpack | spread): the pod's node policy scores
    nodes (give this plugin a weight that dominates the others). A pod's hami.io/gpu-scheduler-policy is
    HAMi's own card order (framework/cardfit.py), not a score's: this plugin leaves GPUs to it."""

    NAME: ClassVar[str] = "PodPolicy"

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        if not pod.node_policy:
            return np.zeros(len(mask.nodes))
        return _POLICIES[pod.node_policy].score(pod, view, mask)

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray | None:
        return None
