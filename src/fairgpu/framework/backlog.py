"""The pending workloads of one leaf queue, in the order the queue offers them.

FIFO queues offer the highest priority, then the oldest. Queues with `fair_within: users` first pick the
active user holding the least, so one user's 500 pods cannot crowd out three users' 10.

A second order serves capacity the queue only borrows (beyond its share when every queue wants more): the
highest priority, then the workload that would have ended first had it started when submitted, so lent GPUs
come back soon when their owners return (lending.py decides which order a pop takes). Both are heaps
with lazy deletion: every push gives the item a fresh token, a copy whose token is not a live item's is
stale and dropped when it surfaces, and a heap of mostly stale copies is rebuilt. A heap is two arrays, its
copies' keys (one row of floats each: exact for ints below 2**53, as priorities, times and sequence numbers
are) and their tokens, kept by compiled sift steps comparing rows field by field as Python compares tuples.
A heap of tuples compared each pair field by field through each field's object, mostly out of the cache
between pops: ~2.3 µs a pop in the cycle.
"""

from __future__ import annotations

import itertools
from collections.abc import Container
from typing import Generic, Protocol, TypeVar

import numpy as np
from numba import njit


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


@njit(cache=True)
def _less(keys: np.ndarray, a: int, b: int) -> bool:
    """Row a's key before row b's, as Python orders the tuples (the first field that differs decides)."""
    for f in range(keys.shape[1]):
        if keys[a, f] != keys[b, f]:
            return bool(keys[a, f] < keys[b, f])
    return False


@njit(cache=True)
def _swap(keys: np.ndarray, tokens: np.ndarray, a: int, b: int) -> None:
    for f in range(keys.shape[1]):
        keys[a, f], keys[b, f] = keys[b, f], keys[a, f]
    tokens[a], tokens[b] = tokens[b], tokens[a]


@njit(cache=True)
def _sift_up(keys: np.ndarray, tokens: np.ndarray, i: int) -> None:
    """Row i (just written at the end) up to its place."""
    while i > 0:
        parent = (i - 1) // 2
        if not _less(keys, i, parent):
            return
        _swap(keys, tokens, i, parent)
        i = parent


@njit(cache=True)
def _sift_down(keys: np.ndarray, tokens: np.ndarray, n: int, i: int) -> None:
    """Row i down to its place among the first n rows."""
    while True:
        least, left = i, 2 * i + 1
        if left < n and _less(keys, left, least):
            least = left
        if left + 1 < n and _less(keys, left + 1, least):
            least = left + 1
        if least == i:
            return
        _swap(keys, tokens, i, least)
        i = least


@njit(cache=True)
def _pop_top(keys: np.ndarray, tokens: np.ndarray, n: int) -> None:
    """Drop row 0 of a heap of n rows: the last row takes its place and sinks."""
    n -= 1
    if n > 0:
        keys[0] = keys[n]
        tokens[0] = tokens[n]
        _sift_down(keys, tokens, n, 0)


@njit(cache=True)
def _heapify(keys: np.ndarray, tokens: np.ndarray, n: int) -> None:
    for i in range(n // 2 - 1, -1, -1):
        _sift_down(keys, tokens, n, i)


class _Heap:
    """Copies (key, token) in heap order: row 0 is the least key."""

    __slots__ = ("keys", "n", "tokens")

    def __init__(self, fields: int) -> None:
        self.keys = np.zeros((8, fields))
        self.tokens = np.zeros(8, dtype=np.int64)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def push(self, key: tuple[float, ...], token: int) -> None:
        if self.n == len(self.tokens):
            self.keys = np.concatenate([self.keys, np.zeros_like(self.keys)])
            self.tokens = np.concatenate([self.tokens, np.zeros_like(self.tokens)])
        self.keys[self.n] = key
        self.tokens[self.n] = token
        _sift_up(self.keys, self.tokens, self.n)
        self.n += 1

    def pop(self) -> None:
        _pop_top(self.keys, self.tokens, self.n)
        self.n -= 1

    def keep(self, live: Container[int]) -> None:
        """Only the copies whose token is in `live`, heap order restored."""
        kept = np.array([t in live for t in self.tokens[: self.n].tolist()], dtype=bool)
        n = int(kept.sum())
        self.keys[:n] = self.keys[: self.n][kept]
        self.tokens[:n] = self.tokens[: self.n][kept]
        self.n = n
        _heapify(self.keys, self.tokens, n)


def _warm() -> None:
    """Load the compiled steps now (the first backlog built), not at the first pop of a timed cycle."""
    heap = _Heap(2)
    for t in range(3):
        heap.push((0.0, float(-t)), t)
    heap.pop()
    heap.keep({1})


class Backlog(Generic[P]):
    _warmed = False

    def __init__(self, by_user: bool = False, lends: bool = False) -> None:
        if not Backlog._warmed:
            Backlog._warmed = True
            _warm()
        self.by_user = by_user
        self.lends = lends  # keeps the order on borrowed capacity too (only then may `pop(lend=True)`)
        self._own: dict[str, _Heap] = {}  # per user, by the queue's order
        self._lend: dict[str, _Heap] = {}  # per user, by the order on borrowed capacity
        self._count: dict[str, int] = {}  # per user: live items
        # token of live copies → their item (it keeps the item, so its id, alive); id(item) → its latest token,
        # which may be stale: a pop deletes one entry, not two, and `push` clears the stale ones in bulk
        self._live: dict[int, P] = {}
        self._token: dict[int, int] = {}
        self._tokens = itertools.count()
        self._held: dict[str, float] = {}  # per user: dominant share held now
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, item: P) -> None:
        user, token = self._user(item), next(self._tokens)
        old = self._token.get(id(item))
        if old is not None:  # pushed again while live: its earlier copies go stale
            self._live.pop(old, None)
        elif len(self._token) > 2 * len(self._live) + 16:
            self._token = {id(it): t for t, it in self._live.items()}
        self._token[id(item)] = token
        self._live[token] = item
        if user not in self._count:
            order, lend = item.order, item.lend_order
            self._own[user], self._lend[user], self._count[user] = _Heap(len(order)), _Heap(len(lend)), 0
        self._count[user] += 1
        self._size += 1
        for heap, key in ((self._own[user], item.order), (self._lend[user], item.lend_order))[: 1 + self.lends]:
            if len(heap) > 2 * self._count[user] + 16:  # mostly stale: rebuild from the live copies
                heap.keep(self._live)
            heap.push(key, token)

    def peek(self) -> P:
        return self._top(self._own[self._next_user()])

    def pop(self, lend: bool = False) -> P:
        """The next item in the queue's order, or with `lend` in the order on borrowed capacity."""
        user = self._next_user()
        heap = (self._lend if lend else self._own)[user]
        item = self._top(heap)
        token = heap.tokens.item(0)
        heap.pop()  # its copy in the other order goes stale
        self._drop(token, user)
        return item

    def remove(self, item: P) -> None:
        token = self._token.get(id(item))
        if token is None or self._live.get(token) is not item:
            raise ValueError("not in this backlog")
        self._drop(token, self._user(item))

    def ordered(self) -> list[P]:
        """Everything pending, in the queue's own order as it would be offered if nothing changed."""
        queues = {u: sorted(self._items(h), key=lambda it: it.order) for u, h in self._own.items()}
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

    def _drop(self, token: int, user: str) -> None:
        del self._live[token]
        self._size -= 1
        self._count[user] -= 1
        if not self._count[user]:
            del self._own[user], self._lend[user], self._count[user]

    def _items(self, heap: _Heap) -> list[P]:
        live = self._live
        return [live[t] for t in heap.tokens[: heap.n].tolist() if t in live]

    def _top(self, heap: _Heap) -> P:
        """The item of the heap's first live copy, after dropping the stale ones above it."""
        live = self._live
        while True:
            item = live.get(heap.tokens.item(0))
            if item is not None:
                return item
            heap.pop()

    def _user(self, item: P) -> str:
        return item.user if self.by_user else ""

    def _next_user(self) -> str:
        if not self.by_user:
            return ""
        held = self._held
        return min(self._own, key=lambda u: (held.get(u, 0.0), self._top(self._own[u]).order))
