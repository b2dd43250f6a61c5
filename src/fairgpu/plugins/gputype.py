"""Filter plugin: GPU models a pod allows or refuses (substring, case-insensitive, like HAMi's
nvidia.com/use-gputype and nouse-gputype)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fairgpu.framework.interfaces import EngineView, Filter, FitMask
from fairgpu.framework.profile import register
from fairgpu.model.pod import PodSpec
from fairgpu.state import ClusterState


@register(Filter, "GpuType")
@dataclass(slots=True)
class GpuType:
    name: str = "GpuType"
    # (state, include, exclude) → slot mask; node inventories change rarely, pod shapes repeat.
    _cache: dict[tuple[ClusterState, tuple[str, ...], tuple[str, ...]], np.ndarray] = field(default_factory=dict)

    def filter(self, pod: PodSpec, view: EngineView, mask: FitMask) -> None:
        if pod.gpu is None or not (pod.gpu_include or pod.gpu_exclude):
            return
        mask.restrict_slots(self._slots(view.state, pod))

    def reasons(self, pod: PodSpec, view: EngineView) -> list[tuple[str, np.ndarray]]:
        if pod.gpu is None or not (pod.gpu_include or pod.gpu_exclude):
            return []
        allowed = self._slots(view.state, pod) & view.state.gpu_usable
        return [("GPU model excluded", allowed.sum(axis=1) < pod.gpu.count)]

    def _slots(self, state: ClusterState, pod: PodSpec) -> np.ndarray:
        key = (state, pod.gpu_include, pod.gpu_exclude)
        hit = self._cache.get(key)
        if hit is None:
            hit = state.model_slots(pod.allows_model)
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = hit
        return hit
