"""Filter plugin: GPUs a pod allows or refuses — by model (substring, case-insensitive, like HAMi's
nvidia.com/use-gputype and nouse-gputype), by UUID (nvidia.com/use-gpuuuid and nouse-gpuuuid, exact) and by
sharing mode (nvidia.com/vgpu-mode: the card's mode must be a substring of it, as in HAMi's checkType)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fairgpu.framework.interfaces import EngineView, FitMask
from fairgpu.model.pod import PodSpec
from fairgpu.state import ClusterState


def _constrained(pod: PodSpec) -> bool:
    return (
        pod.gpu is not None and bool(pod.gpu_include or pod.gpu_exclude or pod.gpu_uuid_include or pod.gpu_uuid_exclude)
    ) or (pod.gpu is not None and pod.gpu_mode is not None)


@dataclass(slots=True)
class GpuType:
    NAME: ClassVar[str] = "GpuType"
    # (node list, constraints) → slot mask. GPU models, UUIDs and modes never change under a ClusterState,
    # and its copies (dry runs) share its node list: keyed by the list, a dry run reuses its state's masks and
    # the cache holds no state (keyed by the state, it kept up to 256 dry-run copies alive with their arrays).
    # The list is kept in the entry so its id cannot be reused by another list while the entry lives.
    _cache: dict[tuple[Any, ...], tuple[list[Any], np.ndarray]] = field(default_factory=dict)

    def indifferent(self, pod: PodSpec, view: EngineView) -> bool:
        """No model, UUID or mode asked for or refused: every GPU passes."""
        return not _constrained(pod)

    def filter(self, pod: PodSpec, view: EngineView, mask: FitMask) -> None:
        if _constrained(pod):
            mask.restrict_slots(self._slots(view.state, pod)[mask.rows])

    def reasons(self, pod: PodSpec, view: EngineView) -> list[tuple[str, np.ndarray]]:
        if not _constrained(pod) or pod.gpu is None:
            return []
        st, count = view.state, pod.gpu.count
        by_model = self._slots(st, pod, uuids=False) & st.gpu_usable
        both = self._slots(st, pod) & st.gpu_usable
        return [
            ("GPU model excluded", by_model.sum(axis=1) < count),
            ("GPU UUID or vgpu-mode excluded", both.sum(axis=1) < count),
        ]

    def _slots(self, state: ClusterState, pod: PodSpec, uuids: bool = True) -> np.ndarray:
        key = (
            id(state.nodes),
            pod.gpu_include,
            pod.gpu_exclude,
            uuids and (pod.gpu_uuid_include, pod.gpu_uuid_exclude, pod.gpu_mode),
        )
        hit = self._cache.get(key)
        if hit is None:
            slots = state.model_slots(pod.allows_model)
            if uuids and (pod.gpu_uuid_include or pod.gpu_uuid_exclude or pod.gpu_mode is not None):
                slots = slots & _uuid_slots(state, pod)
            if len(self._cache) > 256:
                self._cache.clear()
            hit = self._cache[key] = (state.nodes, slots)
        return hit[1]


def _uuid_slots(state: ClusterState, pod: PodSpec) -> np.ndarray:
    """(N, G) bool: GPU slots whose UUID and mode the pod allows (computed once per state and constraint)."""
    ok = np.zeros(state.gpu_valid.shape, dtype=bool)
    for i, nd in enumerate(state.nodes):
        for j, dev in enumerate(nd.gpus):
            ok[i, j] = pod.allows_mode(dev.mode) and pod.allows_uuid(dev.uuid)
    return ok
