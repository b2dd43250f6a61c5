"""QueueSort plugins: which queue's head workload is tried next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fairgpu.framework.interfaces import ActiveQueues, EngineView


@dataclass(slots=True)
class PrioritySort:
    """kube-scheduler's order: highest priority first, then earliest creation, across all tenants."""

    NAME: ClassVar[str] = "PrioritySort"

    within_queue: str = "fifo"

    def pick(self, active: ActiveQueues, view: EngineView) -> int:
        def key(q: int) -> tuple[float, float, int]:
            head = active.head(q)
            return (-head.priority, head.submit_time, q)

        return min(active.queues, key=key)


@dataclass(slots=True)
class FairShare:
    """Top-down through the queue tree, the child furthest below its entitlement goes next: its share ratio
    (current plus decayed past usage, over entitlement) is compared among the top-level queues, then among
    the chosen one's children, and so on down to a leaf. Priority only orders workloads inside a queue.
    Each pick looks at one set of siblings per level, not at every queue."""

    NAME: ClassVar[str] = "FairShare"

    within_queue: str = "queue"

    def pick(self, active: ActiveQueues, view: EngineView) -> int:
        tree = view.tree
        # as Python floats: the same order, without a NumPy scalar per comparison
        ratio, usage, count = view.share_ratio.tolist(), view.usage_dom.tolist(), active.count.tolist()
        level = tree.roots
        while True:
            live = [q for q in level if count[q] > 0]

            def key(q: int) -> tuple[float, float, float, int]:
                first = active.head(q).submit_time if not tree.children[q] else 0.0
                return (ratio[q], usage[q], first, q)

            best = min(live, key=key) if len(live) > 1 else live[0]
            if tree.is_leaf[best]:
                return best
            level = tree.children[best]
