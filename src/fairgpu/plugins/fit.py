"""Filter plugin: CPU, memory, and GPUs under HAMi's per-GPU rules (count on distinct GPUs, cores, MiB)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairgpu.framework.interfaces import EngineView, FitMask
from fairgpu.model.pod import GpuRequest, PodSpec
from fairgpu.state import ClusterState


@dataclass(slots=True)
class Resources:
    NAME: ClassVar[str] = "Resources"

    def filter(self, pod: PodSpec, view: EngineView, mask: FitMask) -> None:
        st = view.state
        mask.restrict_nodes(st.schedulable & (st.cpu_free >= pod.cpu_m) & (st.mem_free >= pod.memory_mib))
        g = pod.gpu
        if g is None:
            return
        if g.exclusive:
            # Whole cards need an idle GPU; the state keeps that index (and its per-node count) current.
            if g.mem_mib:  # an exclusive card that records gpumem still needs that much of it
                mask.restrict_slots(st.gpu_idle & (st.gpu_mem_cap >= g.mem_mib))
            else:
                mask.restrict_slots(st.gpu_idle, st.node_idle_gpus)
        else:
            need = memory_need(g, st)
            ok = (
                st.gpu_usable
                & ~st.gpu_exclusive
                & (st.gpu_tasks < st.gpu_split)
                & (st.gpu_cores_free >= g.cores)
                & (st.gpu_mem_free >= need)
            )
            if g.cores == 0:
                ok &= st.gpu_cores_free > 0  # HAMi: a 0-core task cannot join a fully-cored card
            if pod.gpu_mutex:
                ok &= st.gpu_tasks == 0  # HAMi's `mutex` GPU policy: only cards nobody uses
            mask.restrict_slots(ok)
        mask.restrict_nodes(mask.counts() >= g.count)

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
        if g.exclusive:
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
