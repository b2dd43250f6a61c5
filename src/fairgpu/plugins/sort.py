"""QueueSort plugins: which queue's head workload is tried next."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairgpu.framework.interfaces import EngineView, QueueSort
from fairgpu.framework.profile import register
from fairgpu.model.pod import Workload


@register(QueueSort, "PrioritySort")
@dataclass(slots=True)
class PrioritySort:
    """kube-scheduler's order: highest priority first, then earliest creation, across all tenants."""

    within_queue: str = "fifo"

    def pick(self, queues: list[int], heads: list[Workload], view: EngineView) -> int:
        return min(range(len(heads)), key=lambda i: (-heads[i].priority, heads[i].submit_time, queues[i]))


@register(QueueSort, "FairShare")
@dataclass(slots=True)
class FairShare:
    """Top-down through the queue tree, the child furthest below its entitlement goes next: its share ratio
    (current plus decayed past usage, over entitlement) is compared first among the top-level queues, then
    among siblings below. Priority only orders workloads inside a queue."""

    within_queue: str = "queue"

    def pick(self, queues: list[int], heads: list[Workload], view: EngineView) -> int:
        if len(queues) == 1:
            return 0
        q = np.asarray(queues)
        ratios = view.share_ratio[view.tree.paths[q]]  # (A, depth): root level first
        submit = np.fromiter((w.submit_time for w in heads), dtype=np.float64, count=len(heads))
        # np.lexsort sorts by its last key first
        keys = (q, submit, view.usage_dom[q], *ratios.T[::-1])
        return int(np.lexsort(keys)[0])
