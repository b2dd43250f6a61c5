"""What the metrics and the dashboard read: a scheduler, the time it is at, and a lock around both."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from fairgpu.framework.scheduler import Scheduler
from fairgpu.observe.history import QueueHistory


class Source(Protocol):
    """Hold `lock` while reading `sched`: the driver mutates it under the same lock."""

    lock: threading.RLock
    history: QueueHistory
    name: str  # scenario or cluster name, shown in the dashboard
    profile: str

    @property
    def sched(self) -> Scheduler | None:
        """None while a live scheduler has no engine (its nodes are not known yet, or it stands by)."""
        ...

    @property
    def now(self) -> float: ...

    @property
    def horizon(self) -> float | None:
        """The end of a replay (the dashboard then shows a time slider); None for a live cluster."""
        ...

    def seek(self, t: float) -> None:
        """Move a replay to time t; a live cluster ignores it (it is always at the present)."""
        ...

    def is_leader(self) -> bool: ...

    def ready(self) -> bool:
        """/readyz: a replay always is; a live scheduler once its caches are synced (a standby too: it is warm)."""
        ...


@dataclass(slots=True)
class LiveSource:
    """A scheduler driven in real time: always at the present, no seeking. `engine` gives the scheduler as it
    stands: a controller replaces its engine when the cluster's nodes or queues change, and has none until it
    knows its nodes, or while it stands by."""

    engine: Callable[[], Scheduler | None]
    name: str
    profile: str
    clock: Callable[[], float] = time.time
    leader: Callable[[], bool] = lambda: True
    synced: Callable[[], bool] = lambda: True
    lock: threading.RLock = field(default_factory=threading.RLock)
    history: QueueHistory = field(default_factory=QueueHistory)

    @classmethod
    def of(cls, sched: Scheduler, name: str, clock: Callable[[], float] = time.time) -> LiveSource:
        """One scheduler for good (a benchmark, a test)."""
        return cls(lambda: sched, name, sched.profile.name, clock)

    @property
    def sched(self) -> Scheduler | None:
        return self.engine()

    @property
    def now(self) -> float:
        return self.clock()

    @property
    def horizon(self) -> float | None:
        return None

    def seek(self, t: float) -> None:
        """The present is the only time a live cluster can show."""

    def is_leader(self) -> bool:
        return self.leader()

    def ready(self) -> bool:
        return self.synced()
