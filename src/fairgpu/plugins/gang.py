"""Permit plugin: a gang's pods run all together or not at all."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fairgpu.model.pod import Workload


@dataclass(slots=True)
class Gang:
    NAME: ClassVar[str] = "Gang"

    def permit(self, workload: Workload, placed: int) -> bool:
        return placed >= workload.needed  # an elastic workload runs with min_pods and grows later
