"""Admit plugin: a queue (and every ancestor) never holds more than its limit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairgpu import resources as r
from fairgpu.framework.interfaces import Admit, EngineView
from fairgpu.framework.profile import register
from fairgpu.model.pod import Workload


@register(Admit, "Quota")
@dataclass(slots=True)
class Quota:
    def admit(self, workload: Workload, queue: int, charge: np.ndarray, view: EngineView) -> str | None:
        tree = view.tree
        q = queue
        while q >= 0:
            over = view.usage[q] + charge > tree.limit[q] + 1e-9
            if over.any():
                dim = r.FAIR_DIMS[int(np.argmax(over))]
                return f"queue {tree.queues[q].name} would exceed its {dim} limit"
            q = int(tree.parent[q])
        return None
