"""The pending workloads of one leaf queue, in the order the queue offers them.

FIFO queues offer the highest priority, then the oldest. Queues with `fair_within: users` first pick the
active user holding the least, so one user's 500 pods cannot crowd out three users' 10.

A second order serves capacity the queue only borrows (beyond its share when every queue wants more): the
highest priority, then the workload that would have ended first had it started when submitted, so lent GPUs
come back soon when their owners return (lending.py decides which order a pop takes). Both are heaps
with lazy deletion: every push gives the item a fresh token, a copy whose token is not a live item's is
stale and dropped when it surfaces, and a heap of mostly stale copies is rebuilt. A copy is one int: the
item's key as an order-preserving integer (`_rank`), then its token in the low bits. A heap of ints
compares each pair in one step, where tuples compared field by field and reached into each field's object:
a pop cost ~2.3 µs in the cycle, its heap mostly out of the cache (keys are unique, so the comparison never
reaches the token).
"""

from __future__ import annotations

import heapq
import itertools
import struct
from typing import Generic, Protocol, TypeVar


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
_Heap = list[int]  # copies: (rank of the key << _TOKEN_BITS) | token
_TOKEN_BITS = 48
_TOKEN = (1 << _TOKEN_BITS) - 1
_DOUBLE = struct.Struct("<d")
_BITS = struct.Struct("<Q")
_SIGN = 1 << 63
_ALL = (1 << 64) - 1


def _rank(key: tuple[float, ...]) -> int:
    """An int ordered as the key tuples are: each field as a float (exact for ints below 2**53: priorities,
    times, sequence numbers), mapped to 64 bits that order as the floats do (-0.0 as 0.0, which it equals;
    a NaN, which no order holds in Python, after +inf), the fields one after the other."""
    out = 0
    for x in key:
        bits = _BITS.unpack(_DOUBLE.pack(float(x) + 0.0))[0]
        out = (out << 64) | (bits ^ _ALL if bits & _SIGN else bits | _SIGN)
    return out


class Backlog(Generic[P]):
    def __init__(self, by_user: bool = False, lends: bool = False) -> None:
        self.by_user = by_user
        self.lends = lends  # keeps the order on borrowed capacity too (only then may `pop(lend=True)`)
        self._own: dict[str, _Heap] = {}  # per user, by the queue's order
        self._lend: dict[str, _Heap] = {}  # per user, by the order on borrowed capacity
        self._count: dict[str, int] = {}  # per user: live items
        self._token: dict[int, int] = {}  # id(item) → token of its live copies
        self._live: dict[int, P] = {}  # token of live copies → their item (it keeps the item and its id alive)
        self._tokens = itertools.count()
        self._held: dict[str, float] = {}  # per user: dominant share held now
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, item: P) -> None:
        user, token = self._user(item), next(self._tokens)
        old = self._token.get(id(item))
        if old is not None:  # pushed again while live: its earlier copies go stale
            del self._live[old]
        self._token[id(item)] = token
        self._live[token] = item
        if user not in self._count:
            self._own[user], self._lend[user], self._count[user] = [], [], 0
        self._count[user] += 1
        self._size += 1
        for heap, key in ((self._own[user], item.order), (self._lend[user], item.lend_order))[: 1 + self.lends]:
            if len(heap) > 2 * self._count[user] + 16:  # mostly stale: rebuild from the live copies
                heap[:] = self._live_copies(heap)
                heapq.heapify(heap)
            heapq.heappush(heap, (_rank(key) << _TOKEN_BITS) | token)

    def peek(self) -> P:
        return self._top(self._own[self._next_user()])

    def pop(self, lend: bool = False) -> P:
        """The next item in the queue's order, or with `lend` in the order on borrowed capacity."""
        user = self._next_user()
        heap = (self._lend if lend else self._own)[user]
        item = self._top(heap)
        heapq.heappop(heap)  # its copy in the other order goes stale
        self._drop(item, user)
        return item

    def remove(self, item: P) -> None:
        if id(item) not in self._token:
            raise ValueError("not in this backlog")
        self._drop(item, self._user(item))

    def ordered(self) -> list[P]:
        """Everything pending, in the queue's own order as it would be offered if nothing changed."""
        queues = {u: [self._live[c & _TOKEN] for c in sorted(self._live_copies(h))] for u, h in self._own.items()}
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
        del self._live[self._token.pop(id(item))]
        self._size -= 1
        self._count[user] -= 1
        if not self._count[user]:
            del self._own[user], self._lend[user], self._count[user]

    def _live_copies(self, heap: _Heap) -> _Heap:
        live = self._live
        return [c for c in heap if c & _TOKEN in live]

    def _top(self, heap: _Heap) -> P:
        """The item of the heap's first live copy (then `heap[0]`), after dropping the stale ones above it."""
        live = self._live
        while True:
            item = live.get(heap[0] & _TOKEN)
            if item is not None:
                return item
            heapq.heappop(heap)

    def _user(self, item: P) -> str:
        return item.user if self.by_user else ""

    def _next_user(self) -> str:
        if not self.by_user:
            return ""
        held = self._held
        return min(self._own, key=lambda u: (held.get(u, 0.0), self._top_rank(self._own[u])))

    def _top_rank(self, heap: _Heap) -> int:
        self._top(heap)
        return heap[0] >> _TOKEN_BITS
