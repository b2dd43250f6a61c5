"""What the engine's rooms share: a workload as the engine tracks it (Entry), a cycle's decisions
(CycleResult), what one cycle remembers as it goes (CycleMemo), and the Engine protocol through which
explanations read the scheduler without importing it."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from fairgpu.framework.backlog import Backlog
from fairgpu.framework.interfaces import Bound, EngineView, Evict, Profile
from fairgpu.framework.reservations import Reservations
from fairgpu.model.pod import PodSpec, Workload
from fairgpu.model.queue import QueueTree
from fairgpu.state import ClusterState, Placement


@dataclass(slots=True)
class Entry:
    """A submitted workload as the engine tracks it."""

    workload: Workload
    queue: int
    seq: int
    charge: np.ndarray  # the whole workload's fair vector
    share: float  # its dominant share of the cluster
    # each pod's fair vector, looked up once: by the time a pod is placed, the charge cache may have forgotten
    # its object (ShareAccounting.charge), and hashing a PodSpec costs more than the rest of its accounting
    pod_charges: tuple[np.ndarray, ...] = ()
    placed: list[Placement] = field(default_factory=list)
    key: int = -1  # id of what must fit next: failures are cached by it within a cycle
    terminating: bool = False  # being evicted: holds its resources until the driver removes it
    leaving: np.ndarray | None = None  # fair vector the eviction takes away
    order: tuple[float, float, int] = (0.0, 0.0, 0)  # (-priority, submit time, seq): its place in its queue
    # (-priority, submit time + declared run time (inf if none), submit time, seq): its place on capacity its
    # queue borrows, where the work that would have ended first had it started when submitted goes first
    lend_order: tuple[float, float, float, int] = (0.0, 0.0, 0.0, 0)
    lent: bool = False  # started (or placing pods) on borrowed capacity: beyond its queue's nominal share
    started: float | None = None
    backfilled: frozenset[str] = frozenset()  # reservations whose nodes it entered by promising to end first

    @property
    def user(self) -> str:
        return self.workload.user

    @property
    def rest(self) -> tuple[PodSpec, ...]:
        """The pods not placed yet."""
        return self.workload.pods[len(self.placed) :]

    def __lt__(self, other: Entry) -> bool:
        return self.order < other.order


@dataclass(slots=True)
class CycleResult:
    bound: list[Bound] = field(default_factory=list)
    started: list[str] = field(default_factory=list)  # workloads whose pods now all run
    evictions: list[Evict] = field(default_factory=list)
    attempts: int = 0
    # attempts that filtered and scored the cluster (the rest were answered from the cycle's memo), and
    # preemption searches run: benchmarks tell real decisions from cache skips by them
    evaluated: int = 0
    searches: int = 0


@dataclass(slots=True)
class CycleMemo:
    """What one cycle learns as it goes. Capacity only shrinks within a cycle, so a shape that failed keeps
    failing until the cycle ends; shapes are attempt keys (Entry.key)."""

    refused: list[set[int]]  # per queue: shapes its admission refused
    failed: set[int] = field(default_factory=set)  # shapes that did not fit
    # Shapes kept out of reserved nodes that did not fit, by the shortest duration that failed: a workload
    # avoids more reservations the longer it runs, so one of that shape running at least as long fails too,
    # while a shorter one may still backfill into room held for a later start.
    failed_outside: dict[int, float] = field(default_factory=dict)
    backfill_skips: Counter[int] = field(default_factory=Counter)  # per queue: skipped by failed_outside or held
    # (queue, shape) held back above its queue's share (lending.OverShareHold), by the shortest run held back:
    # its usage only grows within a cycle, so one running at least as long is held back too
    held: dict[tuple[int, int], float] = field(default_factory=dict)
    skipped: dict[int, list[Entry]] = field(default_factory=dict)  # left pending, per queue: pushed back at the end
    attempted: set[str] = field(default_factory=set)  # workloads tried, in this cycle's order
    # (queue, shape) that neither fits nor can make room by preemption: a queue offers its highest priority
    # first, so a failure holds for the rest of its workloads of that shape
    hopeless: set[tuple[int, int]] = field(default_factory=set)
    owed_planned: bool = False  # a hold was planned for a queue owed its share (framework/starving.py)
    # per queue: a shape `queue_done` last found not done; what the memo holds only grows within a cycle, so
    # while that shape is still pending and still not done, the queue is not done, without a scan of the rest
    undone: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, queues: int) -> CycleMemo:
        return cls(refused=[set() for _ in range(queues)])

    def skip(self, q: int, entry: Entry) -> None:
        self.skipped.setdefault(q, []).append(entry)

    def fails_outside(self, key: int, duration: float | None) -> bool:
        """Kept out of reserved nodes, this shape already failed for a workload running no longer."""
        return key in self.failed_outside and _length(duration) >= self.failed_outside[key]

    def failed_outside_for(self, key: int, duration: float | None) -> None:
        self.failed_outside[key] = min(self.failed_outside.get(key, math.inf), _length(duration))

    def held_back(self, q: int, key: int, duration: float | None) -> bool:
        return (q, key) in self.held and _length(duration) >= self.held[q, key]

    def hold_back(self, q: int, key: int, duration: float | None) -> None:
        self.held[q, key] = min(self.held.get((q, key), math.inf), _length(duration))
        self.backfill_skips[q] += 1

    def queue_done(self, q: int, shapes: Collection[int]) -> bool:
        """Every shape the queue still has pending was refused, or failed and cannot preempt: the queue has
        nothing more to try this cycle. A shape that failed only outside reserved nodes, or was held back
        above its queue's share, keeps its queue going for BACKFILL_DEPTH more workloads, which may be short
        enough to backfill or to start (Slurm's bounded backfill test, so a long backlog costs a bounded scan
        per cycle)."""
        refused, scanned = self.refused[q], self.backfill_skips.get(q, 0) >= BACKFILL_DEPTH
        k = self.undone.get(q)
        if k is not None and k in shapes and not self._done(q, k, refused, scanned):
            return False
        for k in shapes:
            if not self._done(q, k, refused, scanned):
                self.undone[q] = k
                return False
        return True

    def _done(self, q: int, k: int, refused: set[int], scanned: bool) -> bool:
        """Queue q has nothing more to try of shape k this cycle (queue_done)."""
        return (
            k in refused
            or (scanned and (q, k) in self.held)
            or ((k in self.failed or (scanned and k in self.failed_outside)) and (q, k) in self.hopeless)
        )


BACKFILL_DEPTH = 100  # workloads per queue and cycle tried for backfill behind one that did not fit


def _length(duration: float | None) -> float:
    return math.inf if duration is None else duration


class Engine(Protocol):
    """What explanations read from the scheduler (framework/scheduler.py implements it)."""

    state: ClusterState
    tree: QueueTree
    profile: Profile
    view: EngineView
    backlogs: list[Backlog[Entry]]
    pending: dict[str, Entry]
    running: dict[str, Entry]
    reservations: Reservations
    held_back: frozenset[tuple[int, int]]  # (queue, shape) held back above its share in the last cycle

    def refresh_shares(self, now: float) -> None: ...

    def admission_refusal(self, entry: Entry) -> str | None: ...

    def running_ends(self) -> list[tuple[float, list[str]]]: ...
