"""Which of a queue's starts are on capacity it borrows (FairShare's `borrowed: soonest-end`).

A queue's nominal share is its dominant share when every queue wants all it can hold. Once the work it runs
by its own order reaches that share, its next start is lent capacity: it takes, of its highest priority, the
work that would have ended first had it started when submitted (Entry.lend_order), so borrowed GPUs come back
soon, without eviction, when a queue below its share wants them; and a long job's wait still counts, so short
work arriving later does not keep it off borrowed capacity for ever. Its own order keeps running in its share.
"""

from __future__ import annotations

import numpy as np

from fairgpu.framework.accounting import ShareAccounting
from fairgpu.framework.engine import Entry


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
