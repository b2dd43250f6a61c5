"""Which of a queue's starts are on capacity it borrows (FairShare's `borrowed: soonest-end`), and which
it may not start above its share (`long_over_share: hold`, OverShareHold).

A queue's nominal share is its dominant share when every queue wants all it can hold. Once the work it runs
by its own order reaches that share, its next start is lent capacity: it takes, of its highest priority, the
work that would have ended first had it started when submitted (Entry.lend_order), so borrowed GPUs come back
soon, without eviction, when a queue below its share wants them; and a long job's wait still counts, so short
work arriving later does not keep it off borrowed capacity for ever. Its own order keeps running in its share.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fairgpu.framework.accounting import ShareAccounting
from fairgpu.framework.engine import Entry
from fairgpu.framework.interfaces import EngineView
from fairgpu.model.queue import QueueTree


class Lending:
    __slots__ = ("_nominal", "_owned", "_owned_dom", "accounting", "on")

    def __init__(self, accounting: ShareAccounting, queues: int, on: bool) -> None:
        self.accounting = accounting
        self.on = on
        self._owned = np.zeros((queues, len(accounting.view.capacity)))  # held by work not started as lent
        self._owned_dom = [0.0] * queues
        self._nominal = accounting.nominal_dom().tolist() if on else []

    def lends(self, q: int) -> bool:
        """Whether queue q's next start is on capacity it borrows."""
        return self.on and self._owned_dom[q] >= self._nominal[q] - 1e-9

    def account(self, entry: Entry, pod_charge: np.ndarray, sign: int) -> None:
        """A pod of `entry` placed (+1) or released (-1): what its queue holds by its own order, unless lent."""
        if self.on and not entry.lent:
            owned = self._owned[entry.queue]
            owned += sign * pod_charge
            self._owned_dom[entry.queue] = self.accounting.dominant(owned)


class OverShareHold:
    """FairShare's `long_over_share: hold`: no start that takes its queue above its share (past usage
    included) and would run longer than another queue, waiting below its own share, waits before it may
    reserve (that queue's `starvation_after`). Work-conserving starts above the share otherwise fill the
    GPUs an under-share queue's big pods or gangs are waiting for with jobs of hours (Philly's taken error,
    docs/performance.md); one that ends within `starvation_after` delays that queue no more than its own
    reservation would. A waiting queue with another way back does not hold others back: the starving holder
    (its reservation keeps room for it, and holding back starts for it would only idle that room) and a
    queue that takes its share back by eviction (as in Starving.owed)."""

    __slots__ = ("on", "tree", "view")

    def __init__(self, tree: QueueTree, view: EngineView, on: bool) -> None:
        self.tree = tree
        self.view = view
        self.on = on

    def holds_back(
        self, entry: Entry, duration: float | None, waits: Callable[[int], bool], holder: int | None
    ) -> bool:
        """Whether `entry` (expected run `duration`) waits; `waits(k)`: queue k waits for room this cycle (work of
        it fitted nowhere, or a gang of it was kept off a starving holder's nodes); `holder`: the holder's queue."""
        v, q = self.view, entry.queue
        if duration is None or v.usage_dom[q] + v.history_dom[q] + entry.share <= v.entitled_dom[q] + 1e-9:
            return False
        under = self.tree.is_leaf & (v.share_ratio < 1 - 1e-9)
        under[q] = False
        if holder is not None:
            under[holder] = False
        for k in np.flatnonzero(under).tolist():
            if duration <= self.tree.queues[k].starvation_after or not waits(k):
                continue
            if not self.tree.takes_share_back(k, v.usage[k]):
                return True
        return False
