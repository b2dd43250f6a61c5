"""Queues (tenants) and the tree they form. Workloads live in leaf queues."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from fairgpu import resources as r
from fairgpu.errors import InputError

V = TypeVar("V", bound="np.ndarray | list[Any]")  # per-queue values that QueueTree.rollup sums


@dataclass(slots=True, frozen=True)
class PreemptionPolicy:
    """When a queue's workloads may evict others, and how its own workloads are evicted."""

    enabled: bool = True  # False: "preemption: never" — this queue never triggers an eviction
    reclaim: bool = True  # take back lent guarantee from queues borrowing above their guarantee
    fair_share: bool = False  # evict from queues above their fair share, down to it
    within_queue: str = "Never"  # "LowerPriority": evict this queue's own lower-priority workloads
    min_runtime: float = 0.0  # seconds: a younger workload of this queue is not a victim
    grace_period: float = 0.0  # seconds between the eviction notice and its GPUs being free
    # seconds: fair share evicts this queue's workloads only while they have run less than this (bounds
    # the work one such eviction loses); reclaim of lent guarantee is not bounded by it
    fair_share_max_runtime: float = math.inf

    def __post_init__(self) -> None:
        if self.within_queue not in WITHIN_QUEUE:
            raise InputError(f"within_queue must be one of {', '.join(WITHIN_QUEUE)}")
        if min(self.min_runtime, self.grace_period, self.fair_share_max_runtime) < 0:
            raise InputError("min_runtime, grace_period and fair_share_max_runtime must not be negative")


WITHIN_QUEUE = ("Never", "LowerPriority")
NEVER = PreemptionPolicy(enabled=False, reclaim=False, fair_share=False)


@dataclass(slots=True)
class QueueSpec:
    name: str
    weight: float = 1.0
    guaranteed: np.ndarray = field(default_factory=r.zeros)  # fair vector; inf = not constrained
    limit: np.ndarray = field(default_factory=lambda: np.full(len(r.FAIR_DIMS), np.inf))
    parent: str | None = None
    usage_half_life: float = 0.0  # seconds; past usage decays with it (0: only current usage counts)
    fair_within: str = "fifo"  # "users": split the queue among its active users instead of FIFO
    starvation_after: float = 600.0  # seconds a workload waits before the engine reserves for it
    lendable: np.ndarray | None = None  # idle guarantee others may borrow; None = all of it
    allocation: str = "dynamic"  # "static": never above its guarantee, and its guarantee is never lent
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)

    def __post_init__(self) -> None:
        if self.allocation not in ALLOCATION:
            raise InputError(f"queue {self.name}: allocation must be one of {', '.join(ALLOCATION)}")
        if self.fair_within not in FAIR_WITHIN:
            raise InputError(f"queue {self.name}: fair_within must be one of {', '.join(FAIR_WITHIN)}")
        if self.usage_half_life < 0 or self.starvation_after < 0:
            raise InputError(f"queue {self.name}: durations must not be negative")


FAIR_WITHIN = ("fifo", "users")
ALLOCATION = ("dynamic", "static")


class QueueTree:
    """Queues indexed 0..n-1 in top-down order (a parent before its children)."""

    def __init__(self, queues: Sequence[QueueSpec]) -> None:
        by_name = {q.name: q for q in queues}
        if len(by_name) != len(queues):
            raise InputError("queue names must be unique")
        for q in queues:
            if q.parent is not None and q.parent not in by_name:
                raise InputError(f"queue {q.name}: parent {q.parent!r} is not a queue")
            if q.weight <= 0:
                raise InputError(f"queue {q.name}: weight must be positive")
        order: list[QueueSpec] = []
        placed: set[str] = set()
        pending = list(queues)
        while pending:
            ready = [q for q in pending if q.parent is None or q.parent in placed]
            if not ready:
                raise InputError(f"queue {pending[0].name}: parent chain forms a cycle")
            order.extend(ready)
            placed.update(q.name for q in ready)
            pending = [q for q in pending if q.name not in placed]
        self.queues: list[QueueSpec] = order
        self.index: dict[str, int] = {q.name: i for i, q in enumerate(order)}
        self.parent = np.array([self.index[q.parent] if q.parent else -1 for q in order], dtype=np.int64)
        self.children: list[list[int]] = [[] for _ in order]
        for i, p in enumerate(self.parent):
            if p >= 0:
                self.children[p].append(i)
        self.roots = [i for i, p in enumerate(self.parent) if p < 0]
        # the same as index arrays, for FairShare's compiled pass over one level
        self.root_ids = np.array(self.roots, dtype=np.int64)
        self.child_ids = [np.array(c, dtype=np.int64) for c in self.children]
        self.leaves = [i for i in range(len(order)) if not self.children[i]]
        self.is_leaf = np.array([not c for c in self.children], dtype=bool)
        self.weight = np.array([q.weight for q in order], dtype=np.float64)
        dims = len(r.FAIR_DIMS)  # named, not -1: a tree with no queues yet (a fresh install) has shape (0, dims)
        self.guaranteed = np.array([q.guaranteed for q in order], dtype=np.float64).reshape(len(order), dims)
        self.limit = np.array([q.limit for q in order], dtype=np.float64).reshape(len(order), dims)
        static = np.array([q.allocation == "static" for q in order], dtype=bool)
        # A static queue is a partition: never above its guarantee (inf in a dimension it does not name).
        self.limit[static] = np.minimum(self.limit[static], self.guaranteed[static])
        self.static = static
        self.limited = bool(np.isfinite(self.limit).any())  # some queue has a limit (admission checks it)
        lendable = np.array(
            [q.guaranteed if q.lendable is None else np.minimum(q.lendable, q.guaranteed) for q in order],
            dtype=np.float64,
        ).reshape(len(order), dims)
        lendable[static] = 0.0
        # What each queue holds back for itself while idle: the part of its guarantee it does not lend.
        finite = np.isfinite(self.guaranteed)
        self.unlent = np.maximum(np.subtract(self.guaranteed, lendable, out=np.zeros_like(lendable), where=finite), 0.0)
        self.holds_back = bool(self.unlent.any())  # some queue keeps idle guarantee to itself (admission asks)
        self.half_life = np.array([q.usage_half_life for q in order], dtype=np.float64)
        # paths[i]: queue ids from the root down to i, padded with i, for top-down fair ordering
        chains = []
        for i in range(len(order)):
            chain = [i]
            while self.parent[chain[-1]] >= 0:
                chain.append(int(self.parent[chain[-1]]))
            chains.append(chain[::-1])
        depth = max((len(c) for c in chains), default=1)
        self.paths = np.array([c + [c[-1]] * (depth - len(c)) for c in chains], dtype=np.int64).reshape(-1, depth)
        self.paths_of = [np.array(c, dtype=np.int64) for c in chains]  # root → i, unpadded
        self.ancestry = [c[::-1] for c in chains]  # i, then each ancestor up to its root (the accounting's walk)

    def reclaims(self, q: int, usage: np.ndarray, charge: np.ndarray | None = None) -> bool:
        """Queue q reclaims its guarantee, and `charge` more fits within it with `usage` held (with no charge:
        `usage` is below it, so some work of q could still be reclaimed)."""
        if not self.queues[q].preemption.reclaim:
            return False
        if charge is None:
            return bool(np.all(usage < self.guaranteed[q] - 1e-9))
        return bool(np.all(usage + charge <= self.guaranteed[q] + 1e-9))

    def takes_share_back(self, q: int, usage: np.ndarray, charge: np.ndarray | None = None) -> bool:
        """Queue q takes its share back by eviction: its policy evicts for its fair share, or reclaims a
        guarantee `charge` still fits in (`reclaims`). Holding room for such a queue would keep its own
        preemptors off the room they make."""
        policy = self.queues[q].preemption
        return policy.enabled and (policy.fair_share or self.reclaims(q, usage, charge))

    def __len__(self) -> int:
        return len(self.queues)

    def rollup(self, values: V) -> V:
        """Per-queue `values` (an array, or a list of lists or counts) with each inner queue's entry made its
        subtree's total: children are added into parents bottom-up, in place (lists are joined, booleans
        or-ed). Returns `values`."""
        for i in reversed(range(len(self.queues))):
            p = self.parent[i]
            if p >= 0:
                values[p] += values[i]
        return values

    def names(self) -> list[str]:
        return [q.name for q in self.queues]

    def leaf_names(self) -> list[str]:
        return [self.queues[i].name for i in self.leaves]
