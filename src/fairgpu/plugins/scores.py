"""Score plugins: which feasible node, and which GPUs on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairgpu.framework.interfaces import EngineView, FitMask, NodeLocal
from fairgpu.framework.node_answers import NodeAnswers
from fairgpu.model.pod import PodSpec
from fairgpu.plugins import node_kernels
from fairgpu.plugins.kernel_warmup import exercise, once
from fairgpu.state import ClusterState

_NODE_RESOURCES = ("cpu", "memory", "gpu")
_ORDER: dict[tuple[str, ...], np.ndarray] = {}  # resources → their indices in the kernel's tuples
# Every node's compiled scores per state, by what they depend on (resources, fuller, what the pod takes): a row's
# score is its own (no sum across rows), so the rows come out as a pass over every node gives them. 256 keys
# per state (Binpack asks ~50 at most: whole-card counts and shared cores).
_EVERY = NodeAnswers(most=256)
_ALONE = np.empty(0)  # free_fraction's `base` when the scores go out on their own


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


def _score(
    pod: PodSpec,
    view: EngineView,
    resources: tuple[str, ...],
    mask: FitMask,
    fuller: bool,
    compiled: bool,
    weight: float = 1.0,
    base: np.ndarray | None = None,
) -> np.ndarray:
    """100 × the mean fraction of `resources` free once the pod took its share (`fuller`: 100 × its
    complement), on the rows of `mask`: in one compiled pass, else on the NumPy path, the same floats. With a
    float64 `base` of the rows, base + weight × those scores (`add_weighted`): the engine's sum, the same floats."""
    if not compiled:
        frac = _free_fraction(pod, view, resources, mask)
        scores = 100.0 * (1.0 - frac) if fuller else 100.0 * frac
        return scores if base is None else np.add(base, weight * scores, dtype=np.float64)
    st = view.state
    cores = pod.gpu.count * pod.gpu.cores if pod.gpu is not None else 0
    order = _ORDER.get(resources)
    if order is None:
        order = _ORDER[resources] = np.array([_NODE_RESOURCES.index(r) for r in resources], dtype=np.int64)
    free, cap = (st.cpu_free, st.mem_free, st.node_cores_free), (st.cpu_cap, st.mem_cap, st.node_cores_cap)
    cpu_m, memory_mib = pod.cpu_m, pod.memory_mib
    if not isinstance(mask.rows, slice):  # one compiled signature for any caller's rows (no compile in a decision)
        rows = np.ascontiguousarray(mask.rows)
        on = _ALONE if base is None else np.ascontiguousarray(base)
        return np.asarray(
            node_kernels.free_fraction(rows, free, cap, cpu_m, memory_mib, cores, order, fuller, on, weight)
        )
    out = _every_node(st, resources, free, cap, cpu_m, memory_mib, cores, order, fuller)
    # the cache's own array: callers read it (the engine copies what it keeps)
    return out if base is None else np.asarray(node_kernels.plus_weighted(np.ascontiguousarray(base), weight, out))


def _every_node(
    st: ClusterState,
    resources: tuple[str, ...],
    free: tuple[np.ndarray, np.ndarray, np.ndarray],
    cap: tuple[np.ndarray, np.ndarray, np.ndarray],
    cpu_m: int,
    memory_mib: int,
    cores: int,
    order: np.ndarray,
    fuller: bool,
) -> np.ndarray:
    """Every node's compiled scores, kept per state (`_EVERY`). A function of its own: its closure would make
    `_score`'s variables cells, made on every call, the changed rows' too."""
    key = (resources, fuller, cpu_m, memory_mib, cores)
    return _EVERY.every(
        st,
        key,
        lambda r: node_kernels.free_fraction(r, free, cap, cpu_m, memory_mib, cores, order, fuller, _ALONE, 1.0),
    )


def _by_pod(pod: PodSpec) -> tuple[str, ...]:
    """Binpack's and Spread's resources: GPU cores for a GPU pod, else CPU and memory."""
    return _GPU if pod.gpu is not None else _CPU_MEMORY


_GPU, _CPU_MEMORY = ("gpu",), ("cpu", "memory")


def _warm(plugin: _FreeFraction) -> None:
    """Load the compiled kernels now, not at the first decisions: once per process."""
    if plugin.compiled:  # the same kernels serve the three plugins
        once("free_fraction", lambda: exercise(plugin))
        once("plus_weighted", _plus_weighted)


def _plus_weighted() -> None:
    """The weighted sum on every node (`add_weighted`), which no plugin's own `score` asks for."""
    node_kernels.plus_weighted(np.zeros(1), 1.0, np.zeros(1))


@dataclass(slots=True)
class _FreeFraction(NodeLocal):
    """A score by the fraction of a node's resources left free once the pod is there (node_kernels.free_fraction):
    the emptiest node first, or with `FULLER` the fullest."""

    FULLER: ClassVar[bool] = False
    compiled: bool = True  # node_kernels.free_fraction; False runs the NumPy path, the same floats

    def __post_init__(self) -> None:
        _warm(self)

    def _resources(self, pod: PodSpec) -> tuple[str, ...]:
        return _by_pod(pod)

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        return self.add_weighted(pod, view, mask, 1.0, None)

    def add_weighted(
        self, pod: PodSpec, view: EngineView, mask: FitMask, weight: float, total: np.ndarray | None
    ) -> np.ndarray:
        """`total` + weight × `score`, the engine's weighted sum and its floats, without the scores' own array
        (framework/evaluations.py); `score` with total None."""
        return _score(pod, view, self._resources(pod), mask, self.FULLER, self.compiled, weight, total)


@dataclass(slots=True)
class LeastAllocated(_FreeFraction):
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
        _warm(self)

    def _resources(self, pod: PodSpec) -> tuple[str, ...]:
        return self.resources

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray:
        return slots


@dataclass(slots=True)
class Binpack(_FreeFraction):
    """Fill the fullest node first (GPU cores for GPU pods, cpu and memory otherwise), and on it the
    fullest GPUs that fit, so whole GPUs and whole nodes stay free for larger requests."""

    NAME: ClassVar[str] = "Binpack"
    FULLER: ClassVar[bool] = True

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray:
        st = view.state
        order = np.lexsort((st.gpu_mem_free[node, slots], st.gpu_cores_free[node, slots]))
        return slots[order]


@dataclass(slots=True)
class Spread(_FreeFraction):
    """The emptiest node first (GPU cores for GPU pods, cpu and memory otherwise), and on it the emptiest
    GPUs, so co-located pods contend the least."""

    NAME: ClassVar[str] = "Spread"

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray:
        st = view.state
        order = np.lexsort((-st.gpu_mem_free[node, slots], -st.gpu_cores_free[node, slots]))
        return slots[order]


# a pod's own policy is rare: its NumPy path, so that importing this module loads no kernel
_POLICIES: dict[str, Binpack | Spread] = {"binpack": Binpack(compiled=False), "spread": Spread(compiled=False)}


@dataclass(slots=True)
class PodPolicy(NodeLocal):
    """HAMi's per-pod annotation hami.io/node-scheduler-policy (binpack | spread): the pod's node policy scores
    nodes (give this plugin a weight that dominates the others). A pod's hami.io/gpu-scheduler-policy is
    HAMi's own card order (framework/cardfit.py), not a score's: this plugin leaves GPUs to it."""

    NAME: ClassVar[str] = "PodPolicy"

    def indifferent(self, pod: PodSpec) -> bool:
        """A pod without a node policy of its own gets 0 on every node here: the engine skips the call."""
        return not pod.node_policy

    def score(self, pod: PodSpec, view: EngineView, mask: FitMask) -> np.ndarray:
        if not pod.node_policy:
            return np.zeros(len(mask.nodes))
        return _POLICIES[pod.node_policy].score(pod, view, mask)

    def gpu_order(self, pod: PodSpec, view: EngineView, node: int, slots: np.ndarray) -> np.ndarray | None:
        return None
