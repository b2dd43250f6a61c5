"""Permit plugin: a gang's pods run all together or not at all."""

from __future__ import annotations

from dataclasses import dataclass

from fairgpu.framework.interfaces import Permit
from fairgpu.framework.profile import register
from fairgpu.model.pod import Workload


@register(Permit, "Gang")
@dataclass(slots=True)
class Gang:
    def permit(self, workload: Workload, placed: int) -> bool:
        return placed >= workload.needed  # an elastic workload runs with min_pods and grows later
