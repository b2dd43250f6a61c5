"""QueueSort plugins: which queue's head workload is tried next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numba import njit

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
        # load the compiled pick now, not at the first decision (kernel_warmup.py)
        one = np.zeros(1)
        _least_served(one, one, np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64))

    def pick(self, active: ActiveQueues, view: EngineView) -> int:
        tree = view.tree
        ratio, usage, count = view.share_ratio, view.usage_dom, active.count
        ids = tree.root_ids
        while True:
            best, ties = _least_served(ratio, usage, count, ids)
            if best < 0:
                raise ValueError("no queue of this level has work to try")
            if ties > 1:  # equally served: the subtree whose oldest waiting workload came first
                r, u = ratio[best], usage[best]
                tied = [q for q in ids.tolist() if count[q] > 0 and ratio[q] == r and usage[q] == u]
                best = min(tied, key=lambda q: (_oldest(active, q), q))
            if not tree.children[best]:
                return best
            ids = tree.child_ids[best]


@njit(cache=True)
def _least_served(ratio: np.ndarray, usage: np.ndarray, count: np.ndarray, ids: np.ndarray) -> tuple[int, int]:
    """Of the queues `ids` with work to try (`count` > 0), the least (share ratio, dominant share of usage),
    compared as Python compares those tuples (a NaN ratio orders as it would there; on a tie, the first),
    and how many of them equal it in ratio and usage (itself included); (-1, 0) if none has work. One
    compiled pass over one level: reading each level's values out as Python floats cost ~4 µs a pick."""
    best, best_r, best_u = -1, 0.0, 0.0
    for j in range(ids.shape[0]):
        q = ids[j]
        if count[q] <= 0:
            continue
        r, u = ratio[q], usage[q]
        if best < 0 or (r < best_r if r != best_r else u < best_u):  # on a tie of both the first stays
            best, best_r, best_u = q, r, u
    ties = 0
    if best >= 0:
        for j in range(ids.shape[0]):
            q = ids[j]
            ties += count[q] > 0 and ratio[q] == best_r and usage[q] == best_u
    return best, ties


def _oldest(active: ActiveQueues, q: int) -> float:
    """Submit time of the oldest head workload in queue q's subtree (only asked on a tie, so the walk over
    the active leaves is off the usual path)."""
    if not active.tree.children[q]:
        return active.head(q).submit_time
    return min(active.head(leaf).submit_time for leaf in active.queues if q in active.tree.ancestry[leaf])
