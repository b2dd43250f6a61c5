"""Where the cluster's GPUs are: allocated, free, or stranded in fragments — one definition for the
metrics and the dashboard."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairgpu.model.node import GPU_CORES
from fairgpu.state import ClusterState


@dataclass(slots=True)
class GpuAccounting:
    """(N, G) arrays over GPU slots (0 where there is no GPU), in GPU-equivalents (cores / 100)."""

    allocated: np.ndarray  # cores held by pods
    free: np.ndarray  # 1 for a usable GPU with no pod on it: whole-GPU pods can take it
    fragmented: np.ndarray  # free cores on a usable GPU that already holds a pod: only fractional pods fit

    def by_model(self, state: ClusterState) -> dict[str, dict[str, float]]:
        out = {}
        for m, model in enumerate(state.models):
            mask = state.gpu_model == m
            out[model] = {
                "gpus": int(mask.sum()),
                "allocated": float(self.allocated[mask].sum()),
                "free": float(self.free[mask].sum()),
                "fragmented": float(self.fragmented[mask].sum()),
                "memory_total_mib": int(state.gpu_mem_cap[mask].sum()),
                "memory_allocated_mib": int((state.gpu_mem_cap - state.gpu_mem_free)[mask].sum()),
            }
        return out


def gpu_accounting(state: ClusterState) -> GpuAccounting:
    usable = state.gpu_usable
    busy = state.gpu_tasks > 0
    allocated = (state.gpu_cores_cap - state.gpu_cores_free) / GPU_CORES
    free = (usable & ~busy).astype(np.float64)
    fragmented = np.where(usable & busy, state.gpu_cores_free / GPU_CORES, 0.0)
    return GpuAccounting(allocated, free, fragmented)
