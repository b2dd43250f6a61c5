"""Admit plugin: a queue (and every ancestor) never holds more than its limit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairgpu import resources as r
from fairgpu.framework.interfaces import EngineView
from fairgpu.model.pod import Workload


@dataclass(slots=True)
class Quota:
    """A queue (and every ancestor) never holds more than its limit — a static queue no more than its
    guarantee — and no queue borrows the part of another's idle guarantee that it does not lend."""

    NAME: ClassVar[str] = "Quota"

    def admit(self, workload: Workload, queue: int, charge: np.ndarray, view: EngineView) -> str | None:
        tree = view.tree
        path = tree.paths_of[queue]
        for q in path[::-1]:
            over = view.usage[q] + charge > tree.limit[q] + 1e-9
            if over.any():
                dim = r.FAIR_DIMS[int(np.argmax(over))]
                what = "guarantee (static allocation)" if tree.static[q] else "limit"
                return f"queue {tree.queues[q].name} would exceed its {dim} {what}"
        # Other queues' idle guarantee that they do not lend (all of it, for static queues) stays free.
        if not tree.unlent.any():
            return None  # nobody holds back idle guarantee (the usual case): nothing more to check
        held_back = np.zeros(len(tree), dtype=bool)
        held_back[tree.leaves] = True
        held_back[path] = False
        idle = np.maximum(tree.unlent[held_back] - view.usage[held_back], 0.0).sum(axis=0)
        short = view.usage[tree.roots].sum(axis=0) + charge > view.capacity - idle + 1e-9
        if (short & (idle > 0)).any():
            dim = r.FAIR_DIMS[int(np.argmax(short & (idle > 0)))]
            return f"the free {dim} is other queues' guarantee, which they do not lend"
        return None
