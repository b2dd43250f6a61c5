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
        # (the path root → queue, dims): one check, none when no queue has a limit (usage is never inf)
        over = view.usage[path] + charge > tree.limit[path] + 1e-9 if tree.limited else None
        if over is not None and over.any():
            for q, row in zip(path[::-1].tolist(), over[::-1], strict=True):  # the nearest queue over says why
                if row.any():
                    dim = r.FAIR_DIMS[int(np.argmax(row))]
                    what = "guarantee (static allocation)" if tree.static[q] else "limit"
                    return f"queue {tree.queues[q].name} would exceed its {dim} {what}"
        # Other queues' idle guarantee that they do not lend (all of it, for static queues) stays free.
        if not tree.holds_back:
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
