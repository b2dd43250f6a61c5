"""How long a workload is expected to run: its own duration when given, else a per-queue estimate learned
from the run times of that queue's finished workloads.

Backfill into reserved nodes and the choice of which nodes to reserve both need expected ends. Without
them, work of unknown length never backfills and running work of unknown length never counts as freeing
its nodes. The estimate is deliberately pessimistic (a high percentile of recent run times, times a safety
margin), and backfill that overruns it anyway is evicted when the reservation comes due
(reservations.py), so an estimate can cost a backfilled job its run, never a reservation its start.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from fairgpu.model.pod import Workload

WINDOW = 64  # recent run times kept per queue: the estimate follows a queue whose work changes
MIN_SAMPLES = 8  # fewer finished workloads than this say too little: no estimate
PERCENTILE = 90.0
MARGIN = 1.25  # the estimate is the percentile times this


class Durations:
    """Per leaf queue, the run times of its latest finished workloads."""

    __slots__ = ("_cache", "_seen")

    def __init__(self, queues: int) -> None:
        self._seen: list[deque[float]] = [deque(maxlen=WINDOW) for _ in range(queues)]
        self._cache: list[float | None] = [None] * queues

    def finished(self, queue: int, ran: float) -> None:
        """A workload of `queue` ran for `ran` seconds and completed (not evicted, not deleted early)."""
        seen = self._seen[queue]
        seen.append(max(ran, 0.0))
        self._cache[queue] = (
            float(np.percentile(np.fromiter(seen, dtype=np.float64), PERCENTILE)) * MARGIN
            if len(seen) >= MIN_SAMPLES
            else None
        )

    def inherit(self, old: Durations, same: list[tuple[int, int]]) -> None:
        """Take over `old`'s run times for each (queue here, queue there) pair."""
        for mine, theirs in same:
            self._seen[mine] = old._seen[theirs].copy()
            self._cache[mine] = old._cache[theirs]

    def learned(self, queue: int) -> float | None:
        """The queue's estimate in seconds; None until it has seen MIN_SAMPLES finished workloads."""
        return self._cache[queue]

    def of(self, wl: Workload, queue: int) -> float | None:
        """The workload's own duration when given, else its queue's estimate (None: unknown)."""
        return wl.duration if wl.duration is not None else self._cache[queue]
