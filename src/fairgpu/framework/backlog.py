"""The pending workloads of one leaf queue, in the order the queue offers them.

FIFO queues offer the highest priority, then the oldest. Queues with `fair_within: users` first pick the
active user holding the least, so one user's 500 pods cannot crowd out three users' 10.

A second order serves capacity the queue only borrows (beyond its share when every queue wants more): the
highest priority, then the workload that would have ended first had it started when submitted, so lent GPUs
come back soon when their owners return (lending.py decides which order a pop takes). Both are heaps
with lazy deletion: every push gives the item a fresh token, a copy whose token is not the item's current one
is stale and dropped when it surfaces, and a heap of mostly stale copies is rebuilt. A copy is the item's
key flattened, then its token and the item: a flat tuple compares several times faster than one holding the
key as a tuple of its own (keys are unique, so the comparison never reaches the token or the item).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Generic, Protocol, TypeVar


class _Pending(Protocol):
    @property
    def user(self) -> str: ...

    @property
    def share(self) -> float: ...  # dominant share of the cluster the whole workload would hold

    @property
    def order(self) -> tuple[float, ...]: ...  # its place in the queue's own order (unique per item)

    @property
    def lend_order(self) -> tuple[float, ...]: ...  # its place on borrowed capacity (unique per item)


P = TypeVar("P", bound=_Pending)
_Copy = tuple[Any, ...]  # (*key, token, item)
_Heap = list[_Copy]


class Backlog(Generic[P]):
    def __init__(self, by_user: bool = False, lends: bool = False) -> None:
        self.by_user = by_user
        self.lends = lends  # keeps the order on borrowed capacity too (only then may `pop(lend=True)`)
        self._own: dict[str, _Heap] = {}  # per user, by the queue's order
        self._lend: dict[str, _Heap] = {}  # per user, by the order on borrowed capacity
        self._count: dict[str, int] = {}  # per user: live items
        self._token: dict[int, int] = {}  # id(item) → token of its live copies (a copy keeps its item alive)
        self._tokens = itertools.count()
        self._held: dict[str, float] = {}  # per user: dominant share held now
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, item: P) -> None:
        user, token = self._user(item), next(self._tokens)
        self._token[id(item)] = token
        if user not in self._count:
            self._own[user], self._lend[user], self._count[user] = [], [], 0
        self._count[user] += 1
        self._size += 1
        for heap, key in ((self._own[user], item.order), (self._lend[user], item.lend_order))[: 1 + self.lends]:
            if len(heap) > 2 * self._count[user] + 16:  # mostly stale: rebuild from the live copies
                heap[:] = self._live(heap)
                heapq.heapify(heap)
            heapq.heappush(heap, (*key, token, item))

    def peek(self) -> P:
        item: P = self._top(self._own[self._next_user()])[-1]
        return item

    def pop(self, lend: bool = False) -> P:
        """The next item in the queue's order, or with `lend` in the order on borrowed capacity."""
        user = self._next_user()
        item: P = self._top((self._lend if lend else self._own)[user])[-1]
        self._drop(item, user)
        return item

    def remove(self, item: P) -> None:
        if self._token.get(id(item)) is None:
            raise ValueError("not in this backlog")
        self._drop(item, self._user(item))

    def ordered(self) -> list[P]:
        """Everything pending, in the queue's own order as it would be offered if nothing changed."""
        queues = {u: [c[-1] for c in sorted(self._live(h))] for u, h in self._own.items()}
        if not self.by_user:
            return queues.get("", [])
        held = dict(self._held)
        out: list[P] = []
        while queues:
            user = min(queues, key=lambda u: (held.get(u, 0.0), queues[u][0].order))
            out.append(queues[user].pop(0))
            held[user] = held.get(user, 0.0) + out[-1].share
            if not queues[user]:
                del queues[user]
        return out

    def account(self, user: str, share: float) -> None:
        """A user of this queue now holds `share` more (or less, if negative) of the cluster."""
        if self.by_user:
            self._held[user] = self._held.get(user, 0.0) + share

    def _drop(self, item: P, user: str) -> None:
        del self._token[id(item)]
        self._size -= 1
        self._count[user] -= 1
        if not self._count[user]:
            del self._own[user], self._lend[user], self._count[user]

    def _live(self, heap: _Heap) -> _Heap:
        return [c for c in heap if self._token.get(id(c[-1])) == c[-2]]

    def _top(self, heap: _Heap) -> _Copy:
        """The heap's first live copy, after dropping the stale ones above it."""
        while self._token.get(id(heap[0][-1])) != heap[0][-2]:
            heapq.heappop(heap)
        return heap[0]

    def _user(self, item: P) -> str:
        return item.user if self.by_user else ""

    def _next_user(self) -> str:
        if not self.by_user:
            return ""
        held = self._held
        return min(self._own, key=lambda u: (held.get(u, 0.0), self._top(self._own[u])[:-2]))
