"""A logical clock for live tests that compare with the simulator: Unix time that stands still while the
cluster works and, once it is quiet, jumps to the earliest time something waits for (a job's arrival, a
pod's exit). The simulator's clock moves the same way, from event to event, so a live run on it decides at
the instants the simulator decides, however loaded the machine: a slow reaction takes wall time, never
simulated time. A wall-clock-scaled run (an hour in ten seconds) put every second of lag on a loaded machine
into minutes of GPU time.

Quiet: the fake apiserver has taken no write for a short wall window, every informer has seen the last event
of its kind, and each party says it is idle (the controller between passes with nothing in flight, the
kubelet with nothing to start)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Iterable

from fairgpu.k8s.informer import Informer

QUIET = 0.05  # wall seconds without a write to the apiserver before the clock may move
MAX_ROUNDS = 2000  # quiet checks without the clock moving or a write landing: something is stuck


class LogicalClock:
    def __init__(self, start: float | None = None) -> None:
        # A whole second: the apiserver's timestamps have second resolution, so pods created at an instant
        # are stamped with that instant.
        self.now = float(int(time.time())) if start is None else start
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self.moves = 0
        self.on_move: list[Callable[[], None]] = []  # told after every move (wake the controller: a cycle now)

    def __call__(self) -> float:
        return self.now

    async def sleep_until(self, t: float) -> None:
        if t <= self.now:
            await asyncio.sleep(0)
            return
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (t, next(self._seq), fut))
        await fut

    def advance(self) -> bool:
        """To the earliest time waited for, waking everything due then; False if nothing waits."""
        while self._waiting and self._waiting[0][2].done():  # cancelled sleepers
            heapq.heappop(self._waiting)
        if not self._waiting:
            return False
        self.now = max(self.now, self._waiting[0][0])
        while self._waiting and self._waiting[0][0] <= self.now:
            _, _, fut = heapq.heappop(self._waiting)
            if not fut.done():
                fut.set_result(None)
        self.moves += 1
        for tell in self.on_move:
            tell()
        return True


class Quiet:
    """When the cluster on the fake apiserver `api` (FakeApiServer) has settled."""

    def __init__(self, api, informers: Iterable[Informer], idle: Iterable[Callable[[], bool]]) -> None:
        self.api, self.informers, self.idle = api, list(informers), list(idle)

    def _last_revisions(self) -> dict[str, int] | None:
        """The revision of the last event of each resource kind (None if a write raced the look)."""
        out: dict[str, int] = {}
        try:
            for entry in reversed(self.api.api.store.log):
                out.setdefault(entry.resource.plural, entry.rev)
        except RuntimeError:  # the server's thread wrote meanwhile
            return None
        return out

    def _caught_up(self) -> bool:
        last = self._last_revisions()
        if last is None:
            return False
        return all(int(i.resource_version or 0) >= last.get(i.kind.plural, 0) for i in self.informers)

    async def settle(self) -> None:
        for _ in range(MAX_ROUNDS):
            rev = self.api.api.store.rev
            await asyncio.sleep(QUIET)
            for _ in range(3):  # let tasks woken by the last events take their turn
                await asyncio.sleep(0)
            if self.api.api.store.rev == rev and all(ok() for ok in self.idle) and self._caught_up():
                return
        raise AssertionError(f"the cluster did not settle in {MAX_ROUNDS} rounds")


async def drive(clock: LogicalClock, quiet: Quiet) -> None:
    """Move the clock whenever the cluster is quiet, for as long as the test runs."""
    while True:
        await quiet.settle()
        if not clock.advance():
            await asyncio.sleep(QUIET)
