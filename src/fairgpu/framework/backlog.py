"""The pending workloads of one leaf queue, in the order the queue offers them.

FIFO queues offer the highest priority, then the oldest. Queues with `fair_within: users` first pick the
active user holding the least, so one user's 500 pods cannot crowd out three users' 10.
"""

from __future__ import annotations

import heapq
from typing import Any, Generic, Protocol, TypeVar


class _Pending(Protocol):
    @property
    def user(self) -> str: ...

    @property
    def share(self) -> float: ...  # dominant share of the cluster the whole workload would hold

    def __lt__(self, other: Any, /) -> bool: ...


P = TypeVar("P", bound=_Pending)


class Backlog(Generic[P]):
    def __init__(self, by_user: bool = False) -> None:
        self.by_user = by_user
        self._heaps: dict[str, list[P]] = {}
        self._held: dict[str, float] = {}  # per user: dominant share held now
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, item: P) -> None:
        heapq.heappush(self._heaps.setdefault(self._user(item), []), item)
        self._size += 1

    def peek(self) -> P:
        return self._heaps[self._next_user()][0]

    def pop(self) -> P:
        user = self._next_user()
        heap = self._heaps[user]
        item = heapq.heappop(heap)
        if not heap:
            del self._heaps[user]
        self._size -= 1
        return item

    def remove(self, item: P) -> None:
        user = self._user(item)
        heap = self._heaps[user]
        heap.remove(item)
        if heap:
            heapq.heapify(heap)
        else:
            del self._heaps[user]
        self._size -= 1

    def ordered(self) -> list[P]:
        """Everything pending, in the order it would be offered if nothing changed."""
        if not self.by_user:
            return sorted(self._heaps.get("", []))
        queues = {u: sorted(h) for u, h in self._heaps.items()}
        held = dict(self._held)
        out: list[P] = []
        while queues:
            user = min(queues, key=lambda u: (held.get(u, 0.0), queues[u][0]))
            out.append(queues[user].pop(0))
            held[user] = held.get(user, 0.0) + out[-1].share
            if not queues[user]:
                del queues[user]
        return out

    def account(self, user: str, share: float) -> None:
        """A user of this queue now holds `share` more (or less, if negative) of the cluster."""
        if self.by_user:
            self._held[user] = self._held.get(user, 0.0) + share

    def _user(self, item: P) -> str:
        return item.user if self.by_user else ""

    def _next_user(self) -> str:
        if not self.by_user:
            return ""
        held = self._held
        return min(self._heaps, key=lambda u: (held.get(u, 0.0), self._heaps[u][0]))
