"""Filter plugin: CPU, memory, and GPUs under HAMi's per-GPU rules (count on distinct GPUs, cores, MiB)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairgpu.framework.cardfit import card_ok, fit_containers
from fairgpu.framework.interfaces import EngineView, FitMask
from fairgpu.framework.node_answers import NodeAnswers
from fairgpu.model.pod import GpuRequest, PodSpec
from fairgpu.plugins import node_kernels
from fairgpu.plugins.kernel_warmup import exercise_filter, once
from fairgpu.state import ClusterState

# Every node's cards open to one more task (`cardfit.open_cards`), kept per state: a shared-card shape new to
# the engine's cache checks every card (~3,600 times a benchmark cycle at 5,000 nodes), and this part of the
# check is the same for every such shape.
_OPEN = NodeAnswers()


def _opened(st: ClusterState) -> np.ndarray:
    return _OPEN.every(
        st,
        None,
        lambda rows: node_kernels.open_cards(rows, st.gpu_usable, st.gpu_exclusive, st.gpu_tasks, st.gpu_split),
    )


@dataclass(slots=True)
class Resources:
    NAME: ClassVar[str] = "Resources"
    # a GPU pod's checks on changed rows, and a shared-card pod's on every node from the open cards kept
    # (`_opened`), in one compiled pass each (node_kernels.py); False runs the NumPy path, the same verdicts
    compiled: bool = True

    def __post_init__(self) -> None:
        if self.compiled:
            once("Resources", lambda: exercise_filter(self))

    def filter(self, pod: PodSpec, view: EngineView, mask: FitMask) -> None:
        st, r, g = view.state, mask.rows, pod.gpu
        per_container = g is not None and pod.per_container
        whole = g is not None and not st.has_mig and st.takes_whole_cards(g)
        # A GPU pod's checks in one compiled pass: on a few changed rows, or a shared-card pod's on every node
        # from the open cards kept (idle whole cards on every node are the state's own index: NumPy below)
        if self.compiled and g is not None and not (st.has_mig or per_container or (isinstance(r, slice) and whole)):
            if isinstance(r, slice):
                nodes, ok = np.empty(st.num_nodes, dtype=bool), np.empty(st.gpu_valid.shape, dtype=bool)
                self._every(pod, g, st, nodes, ok)
            else:
                nodes, ok = self._compiled(pod, g, st, r, whole, *node_kernels.NOWHERE)
            mask.restrict_nodes(nodes)
            mask.restrict_slots(ok)
            if mask.slots is not ok:  # an earlier filter narrowed the slots (GpuType): count what is left
                mask.restrict_nodes(mask.counts() >= g.count)
            return
        nodes = st.schedulable[r] & (st.cpu_free[r] >= pod.cpu_m) & (st.mem_free[r] >= pod.memory_mib)
        if g is None or per_container:
            mask.restrict_nodes(nodes)
            if per_container:
                self._per_container(pod, st, mask)
            return
        if not whole:  # a GPU policy (`mutex` too) goes per container, above
            mask.restrict_slots(card_ok(st, g, r))
        elif g.mem_mib:  # an exclusive card that records gpumem still needs that much of it
            mask.restrict_slots(st.gpu_idle[r] & (st.gpu_mem_cap[r] >= g.mem_mib))
        else:  # idle cards: the state keeps that index current, and its per-node count (the mask's counts)
            mask.restrict_slots(st.gpu_idle[r], st.node_idle_gpus[r])
        mask.restrict_nodes(nodes & (mask.counts() >= g.count))

    def filter_into(
        self, pod: PodSpec, view: EngineView, rows: np.ndarray | slice, nodes: np.ndarray, slots: np.ndarray | None
    ) -> FitMask | None:
        """`filter` when it is the pod's only filter (framework/evaluations.py), written into the pod shape's
        arrays of every node by the compiled passes: on changed rows (returned as their own arrays as well), and
        on every node for a shared-card shape new to the engine."""
        st, g = view.state, pod.gpu
        if not self.compiled or g is None or slots is None or st.has_mig or pod.per_container:
            return None
        whole = st.takes_whole_cards(g)
        if isinstance(rows, slice):
            if whole:  # idle cards on every node: the state's own index, no pass to save
                return None
            self._every(pod, g, st, nodes, slots)
            return FitMask(nodes, slots)
        at, ok = self._compiled(pod, g, st, rows, whole, nodes, slots)
        return FitMask(at, ok, rows=rows)

    @staticmethod
    def _every(pod: PodSpec, g: GpuRequest, st: ClusterState, nodes: np.ndarray, slots: np.ndarray) -> None:
        """A shared-card pod's checks on every node in one compiled pass from the open cards kept (`_opened`),
        written into (N,) `nodes` and (N, G) `slots`."""
        request = np.array([pod.cpu_m, pod.memory_mib, g.cores, g.mem_mib, g.mem_pct, g.count], dtype=np.int64)
        node_kernels.open_cards_take(
            st.schedulable, st.cpu_free, st.mem_free, _opened(st), st.gpu_cores_free, st.gpu_mem_free, st.gpu_mem_cap,
            st.gpu_whole, st.gpu_tasks, st.gpu_cores_cap, request, nodes, slots,
        )  # fmt: skip

    @staticmethod
    def _compiled(
        pod: PodSpec,
        g: GpuRequest,
        st: ClusterState,
        rows: np.ndarray,
        whole: bool,
        nodes: np.ndarray,
        slots: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The compiled pass of a GPU pod on these rows: the node checks and the cards (idle ones for whole
        cards, else `card_ok`'s) in one pass, nodes with too few such cards refused there; the verdicts written
        at `rows` into `nodes` and `slots` too unless they are empty (`node_kernels.NOWHERE`)."""
        if whole:
            return node_kernels.idle_cards(
                rows, st.schedulable, st.cpu_free, st.mem_free, st.gpu_idle, st.gpu_mem_cap, pod.cpu_m,
                pod.memory_mib, g.mem_mib, g.count, nodes, slots,
            )  # fmt: skip
        request = np.array([pod.cpu_m, pod.memory_mib, g.cores, g.mem_mib, g.mem_pct, g.count], dtype=np.int64)
        return node_kernels.cards(
            rows, st.schedulable, st.cpu_free, st.mem_free, st.gpu_usable, st.gpu_exclusive, st.gpu_tasks,
            st.gpu_split, st.gpu_cores_free, st.gpu_mem_free, st.gpu_mem_cap, st.gpu_whole, st.gpu_cores_cap,
            request, nodes, slots,
        )  # fmt: skip

    @staticmethod
    def _per_container(pod: PodSpec, st: ClusterState, mask: FitMask) -> None:
        """Nodes where HAMi's Fit finds every GPU container its cards in turn; the cards it picks stay in the
        mask, so placing the pod on any kept node picks them again (framework/cardfit.py)."""
        local = np.flatnonzero(mask.nodes)  # positions in the mask's rows
        rows = np.arange(st.num_nodes)[mask.rows][local]
        fits, picks = fit_containers(st, pod, rows, None if mask.slots is None else mask.slots[local])
        kept = local[fits]
        nodes = np.zeros(len(mask.nodes), dtype=bool)
        nodes[kept] = True
        slots = np.zeros((len(mask.nodes), st.gpu_valid.shape[1]), dtype=bool)
        for p in picks:
            slots[kept[:, None], p[fits]] = True
        mask.restrict_nodes(nodes)
        mask.restrict_slots(slots)

    def reasons(self, pod: PodSpec, view: EngineView) -> list[tuple[str, np.ndarray]]:
        """Each way a node can fail this filter, for explanations (a node counts under the first)."""
        st = view.state
        out = [
            ("node cordoned", ~st.schedulable),
            ("insufficient CPU", st.cpu_free < pod.cpu_m),
            ("insufficient memory", st.mem_free < pod.memory_mib),
        ]
        g = pod.gpu
        if g is None:
            return out
        out.append(("too few GPUs", st.gpu_usable.sum(axis=1) < g.count))
        if st.takes_whole_cards(g) and not st.has_mig:
            out.append(("too few idle GPUs", st.node_idle_gpus < g.count))
            return out
        need = memory_need(g, st)
        ok = st.gpu_usable & ~st.gpu_exclusive & (st.gpu_cores_free >= max(g.cores, 1))
        out.append(("insufficient GPU cores", ok.sum(axis=1) < g.count))
        ok &= st.gpu_mem_free >= need
        out.append(("insufficient GPU memory", ok.sum(axis=1) < g.count))
        ok &= st.gpu_tasks < st.gpu_split
        out.append(("GPU task limit reached", ok.sum(axis=1) < g.count))
        return out


def memory_need(g: GpuRequest, st: ClusterState) -> np.ndarray | int:
    """MiB a shared-GPU request needs on each card: its gpumem, else its percentage of each card's memory."""
    return g.mem_mib if g.mem_mib else st.gpu_mem_cap * g.mem_pct // 100
