"""Per-queue usage and fair share over time, per resource, in bounded memory, for the queue view."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fairgpu.framework.scheduler import Scheduler

MAX_SAMPLES = 2048  # past this, every other sample is dropped: a long run keeps its shape at half resolution


@dataclass(slots=True)
class QueueHistory:
    """Samples of (usage, entitled), each (Q, R) over FAIR_DIMS, holding until the next sample."""

    t: list[float] = field(default_factory=list)
    usage: list[np.ndarray] = field(default_factory=list)
    entitled: list[np.ndarray] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)  # the tree the samples index

    def sample(self, now: float, sched: Scheduler) -> None:
        names = sched.tree.names()
        if names != self.queues:  # a live scheduler rebuilt with other queues: the old rows mean nothing now
            self.t, self.usage, self.entitled, self.queues = [], [], [], names
        if self.t and self.t[-1] == now:  # several cycles at one instant: the last one holds
            self.t.pop()
            self.usage.pop()
            self.entitled.pop()
        self.t.append(now)
        self.usage.append(sched.view.usage.copy())
        self.entitled.append(sched.view.entitled.copy())
        if len(self.t) > MAX_SAMPLES:
            # keep the newest sample so the view always ends at the current state
            keep = [*range(0, len(self.t) - 1, 2), len(self.t) - 1]
            self.t = [self.t[i] for i in keep]
            self.usage = [self.usage[i] for i in keep]
            self.entitled = [self.entitled[i] for i in keep]

    def series(self, queue: int, dim: int) -> tuple[list[float], list[float], list[float]]:
        """(times, usage, entitled) of one queue in one resource."""
        if not self.t:
            return [], [], []
        usage = np.array([u[queue, dim] for u in self.usage])
        entitled = np.array([e[queue, dim] for e in self.entitled])
        return list(self.t), usage.tolist(), entitled.tolist()
