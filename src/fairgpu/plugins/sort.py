"""QueueSort plugins: which queue's head workload is tried next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fairgpu.framework.interfaces import ActiveQueues, EngineView

BORROWED = ("fifo", "soonest-end")


@dataclass(slots=True)
class PrioritySort:
    """kube-scheduler's order: highest priority first, then earliest creation, across all tenants."""

    NAME: ClassVar[str] = "PrioritySort"

    within_queue: str = "fifo"
    borrowed: str = "fifo"  # one cluster-wide order: no share to borrow beyond

    def __post_init__(self) -> None:
        if self.borrowed != "fifo":
            raise ValueError(f"borrowed: {self.borrowed!r}: PrioritySort keeps one order for all (fifo)")

    def pick(self, active: ActiveQueues, view: EngineView) -> int:
        head = active.head
        return min((-(h := head(q)).priority, h.submit_time, q) for q in active.queues)[2]


@dataclass(slots=True)
class FairShare:
    """Top-down through the queue tree, the child furthest below its entitlement goes next: its share ratio
    (current plus decayed past usage, over entitlement) is compared among the top-level queues, then among
    the chosen one's children, and so on down to a leaf. Priority only orders workloads inside a queue.
    Each pick looks at one set of siblings per level, not at every queue."""

    NAME: ClassVar[str] = "FairShare"

    within_queue: str = "queue"
    # What a queue starts on capacity it borrows beyond its nominal share: "fifo" (its own order) or
    # "soonest-end" (the work that would have ended first had it started when submitted; docs/profiles.md)
    borrowed: str = "fifo"
    # "hold": no start above the queue's share that runs longer than a queue waiting below its own share
    # waits before it may reserve (framework/lending.py OverShareHold; the default); "start": work-conserving
    long_over_share: str = "hold"

    def __post_init__(self) -> None:
        if self.borrowed not in BORROWED:
            raise ValueError(f"borrowed: {self.borrowed!r} is not one of {', '.join(BORROWED)}")
        if self.long_over_share not in ("hold", "start"):
            raise ValueError(f"long_over_share: {self.long_over_share!r} is not one of hold, start")

    def pick(self, active: ActiveQueues, view: EngineView) -> int:
        tree = view.tree
        ratio, usage, count = view.share_ratio, view.usage_dom, active.count
        level, ids = tree.root_ids, tree.roots
        while True:
            # One level's values read together, as Python floats: the same order, without a NumPy scalar per
            # comparison, nor every queue's read (a 240-queue tree) to look at six. q breaks ties: keys unique.
            live = [
                (r, u, q)
                for r, u, q, c in zip(
                    ratio[level].tolist(), usage[level].tolist(), ids, count[level].tolist(), strict=True
                )
                if c > 0
            ]
            r, u, best = min(live)
            if len(live) > 1:
                tied = [q for rq, uq, q in live if rq == r and uq == u]
                if len(tied) > 1:  # equally served: the subtree whose oldest waiting workload came first
                    best = min(tied, key=lambda q: (_oldest(active, q), q))
            if not tree.children[best]:
                return best
            level, ids = tree.child_ids[best], tree.children[best]


def _oldest(active: ActiveQueues, q: int) -> float:
    """Submit time of the oldest head workload in queue q's subtree (only asked on a tie, so the walk over
    the active leaves is off the usual path)."""
    if not active.tree.children[q]:
        return active.head(q).submit_time
    return min(active.head(leaf).submit_time for leaf in active.queues if q in active.tree.ancestry[leaf])
