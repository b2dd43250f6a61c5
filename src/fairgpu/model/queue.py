"""Queues (tenants) and the tree they form. Workloads live in leaf queues."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fairgpu import resources as r


@dataclass(slots=True)
class QueueSpec:
    name: str
    weight: float = 1.0
    guaranteed: np.ndarray = field(default_factory=r.zeros)  # fair vector; inf = not constrained
    limit: np.ndarray = field(default_factory=lambda: np.full(len(r.FAIR_DIMS), np.inf))
    parent: str | None = None


class QueueTree:
    """Queues indexed 0..n-1 in top-down order (a parent before its children)."""

    def __init__(self, queues: Sequence[QueueSpec]) -> None:
        by_name = {q.name: q for q in queues}
        if len(by_name) != len(queues):
            raise ValueError("queue names must be unique")
        for q in queues:
            if q.parent is not None and q.parent not in by_name:
                raise ValueError(f"queue {q.name}: parent {q.parent!r} is not a queue")
            if q.weight <= 0:
                raise ValueError(f"queue {q.name}: weight must be positive")
        order: list[QueueSpec] = []
        placed: set[str] = set()
        pending = list(queues)
        while pending:
            ready = [q for q in pending if q.parent is None or q.parent in placed]
            if not ready:
                raise ValueError(f"queue {pending[0].name}: parent chain forms a cycle")
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
        self.leaves = [i for i in range(len(order)) if not self.children[i]]
        self.is_leaf = np.array([not c for c in self.children], dtype=bool)
        self.weight = np.array([q.weight for q in order], dtype=np.float64)
        self.guaranteed = np.array([q.guaranteed for q in order], dtype=np.float64).reshape(len(order), -1)
        self.limit = np.array([q.limit for q in order], dtype=np.float64).reshape(len(order), -1)

    def __len__(self) -> int:
        return len(self.queues)

    def names(self) -> list[str]:
        return [q.name for q in self.queues]

    def leaf_names(self) -> list[str]:
        return [self.queues[i].name for i in self.leaves]
