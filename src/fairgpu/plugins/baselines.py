"""Score plugins: the placement baselines of the FGD paper (Weng et al., USENIX ATC 2023, §6), scored as
its simulator scores them (integer node scores 0..100; ties go to the next score plugin, e.g. `Random`),
so that all of them compare with `Fragmentation` in one harness.

GPUs on the chosen node are taken fullest-first (the simulator's default GPU pick for a shared GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from fairgpu.framework.interfaces import EngineView, FitMask, NodeLocal
from fairgpu.model.node import GPU_CORES
from fairgpu.model.pod import PodSpec
from fairgpu.plugins.scores import Binpack

_fullest_first = Binpack.gpu_order


def _pod_gpu(pod: PodSpec) -> tuple[int, int]:
    """(GPUs, cores per GPU) the pod takes."""
    return (pod.gpu.count, pod.gpu.cores) if pod.gpu is not None else (0, 0)


def _chosen_free(pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
    """Free cores of the GPU a one-GPU shared pod would take on each node of the mask (the fullest that fits)."""
    assert mask.slots is not None
    st, r = view.state, mask.rows
    free = np.where(mask.slots, np.where(st.gpu_usable[r], st.gpu_cores_free[r], 0), GPU_CORES + 1)
    return np.asarray(free.min(axis=1))


@dataclass(slots=True)
class Random:
    """Uniformly random node and GPUs; seeded, so runs repeat. With a small weight: a random tie-break.

    `fixed` draws once and keeps the draw: a random order of the nodes, ties always going to the first
    node in it. That is how the FGD authors' simulator breaks ties (it takes the lexicographically smallest
    node name, names being prefixed with a seeded random permutation), and it matters: pods no score
    tells apart pile onto the same nodes instead of spreading over all of them."""

    NAME: ClassVar[str] = "Random"

    seed: int = 0
    fixed: bool = False
    _rng: np.random.Generator = field(init=False)
    _draw: np.ndarray | None = field(init=False, default=None)
    _pods: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def generation(self, pod: PodSpec, view: EngineView) -> int:
        # fresh draws for every pod: every node is scored anew (a fixed order never changes)
        if not self.fixed:
            self._pods += 1
        return self._pods

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        n = view.state.num_nodes
        if not self.fixed:
            return self._rng.uniform(0.0, 100.0, n)[mask.rows]
        if self._draw is None or len(self._draw) != n:
            self._draw = 100.0 * (n - self._rng.permutation(n)) / n
        return self._draw[mask.rows]

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray:
        return self._rng.permutation(slots)


@dataclass(slots=True)
class BestFit(NodeLocal):
    """The node left with the least CPU and GPU after placing the pod (each over the largest node's)."""

    NAME: ClassVar[str] = "BestFit"

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        st = view.state
        k, cores = _pod_gpu(pod)
        max_cpu = max(int(st.cpu_cap.max()), 1)
        max_gpu = max(int(st.node_cores_cap.max()), 1)
        r = mask.rows
        left = 0.5 * (st.cpu_free[r] - pod.cpu_m) / max_cpu + 0.5 * (st.node_cores_free[r] - k * cores) / max_gpu
        return np.asarray(np.floor(100.0 * (1.0 - left)))

    gpu_order = _fullest_first


@dataclass(slots=True)
class DotProd(NodeLocal):
    """Tetris-style alignment as the FGD authors ran it ("merge" dimensions, "max" normalisation): the node's
    free (CPU, GPU cores in total) and the pod's request, each over the largest node's; the smaller their
    dot product, the better."""

    NAME: ClassVar[str] = "DotProd"

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        st = view.state
        k, cores = _pod_gpu(pod)
        max_cpu = max(int(st.cpu_cap.max()), 1)
        max_gpu = max(int(st.node_cores_cap.max()), 1)
        cpu, gpu = st.cpu_free[mask.rows] / max_cpu, st.node_cores_free[mask.rows] / max_gpu
        dot = cpu * (pod.cpu_m / max_cpu) + gpu * (k * cores / max_gpu)
        return np.asarray(np.floor(100.0 * (1.0 - dot / 2)))

    gpu_order = _fullest_first


@dataclass(slots=True)
class GpuPacking(NodeLocal):
    """Shared GPUs first, then free GPUs of a node already in use, then an idle node."""

    NAME: ClassVar[str] = "GpuPacking"

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        st, r, n = view.state, mask.rows, len(mask.nodes)
        k = _pod_gpu(pod)[0]
        idle = st.node_idle_gpus[r]
        idle_node = idle == st.gpu_usable[r].sum(axis=1)
        uses_idle = np.full(n, k)  # GPUs wholly free that the pod would take
        shared = np.zeros(n)
        if pod.gpu is not None and not st.takes_whole_cards(pod.gpu):
            chosen = _chosen_free(pod, view, mask)
            uses_idle = (chosen >= GPU_CORES).astype(np.int64)
            shared = chosen * 100 // GPU_CORES // 10
        score = np.where(
            idle_node,
            np.maximum(100 // 3 - idle, idle),
            np.where(uses_idle > 0, np.maximum(100 // 2 - uses_idle, 100 // 3), np.maximum(100 - shared, 100 // 2)),
        )
        return score.astype(np.float64) if k else np.zeros(n)

    gpu_order = _fullest_first


@dataclass(slots=True)
class GpuClustering(NodeLocal):
    """Pods of one kind go together, kinds being shared-GPU pods and whole-GPU pods (the simulator also
    tells whole-GPU pods apart by GPU count, which the state's arrays cannot): nodes holding only that
    kind first, then nodes holding it among others, then idle nodes, then the rest; within each band the
    fuller node."""

    NAME: ClassVar[str] = "GpuClustering"

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        st, r = view.state, mask.rows
        if pod.gpu is None:
            return np.zeros(len(mask.nodes))
        exclusive = st.gpu_exclusive[r]
        shared = ((st.gpu_tasks[r] > 0) & ~exclusive).any(axis=1)
        whole = exclusive.any(axis=1)
        same, other = (whole, shared) if st.takes_whole_cards(pod.gpu) else (shared, whole)
        band = np.where(same & ~other, 3, np.where(same, 2, np.where(~(shared | whole), 1, 0)))
        max_gpu = max(int(st.node_cores_cap.max()), 1)
        fill = 25 * (max_gpu - st.node_cores_free[r]) // max_gpu
        return np.asarray(25 * band + fill, dtype=np.float64)

    gpu_order = _fullest_first
