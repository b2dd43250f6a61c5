"""The scheduling loop's proof of life: a heartbeat it stamps on every pass, which the lease's elector and
/healthz read (client-go's HealthzAdaptor asks the same of a lease holder, here the scheduler itself answers).

Why: an elector renews whether or not the scheduler it speaks for makes progress. A scheduling loop stuck on
an await that never returns, or blocked for minutes, kept the lease, so no standby took over, and /healthz
said "ok". Now the elector neither takes nor renews the lease while the heartbeat is older than
`stale_after` (it steps down at once when it leads), and /healthz answers 503 so the kubelet restarts the pod.

The bound. An idle loop passes every `every` seconds; a busy one stamps at each of a cycle's slices
(controller.CYCLE_SLICE), so a long cycle that progresses stays fresh however long it is. What can age a
healthy heartbeat is the idle wait (`every`) or one synchronous stretch between two stamps (a rebuild, a
large list parsed) on a starved CPU; a new term's fresh list is waited for beating (controller._beating).
The default, 5 s, is five idle passes and a third of deploy/'s 15 s lease; it tolerates a synchronous
stretch of about four seconds (the tests keep the lease through passes that each hold the loop 1.2 s under
a 2.5 s bound). A hung leader's elector wakes when the heartbeat goes stale, steps down (the fence closes)
and releases the lease unless a write of the loop may still land (writes.py, leader.py): a standby takes
over about 5 s + a retry period after the hang; otherwise the lease expires, a lease duration later (a dead
replica's too).
Below three passes an idle, healthy loop that misses one stamp to a busy CPU would be called hung: refused.

The stamp is CLOCK_MONOTONIC in shared memory, so the elector's own process (elector_process.py) reads
it as the elector's thread does. Before the first pass (the caches' first list) nothing is stamped: the
elector does not take the lease before the scheduler can use it (kube-scheduler syncs its caches before
it runs for the lease), and /healthz does not call a replica that is still listing hung.
"""

from __future__ import annotations

import ctypes
import math
import time
from multiprocessing.sharedctypes import RawValue

from fairgpu.errors import InputError

EVERY = 1.0  # seconds: the longest an idle scheduling loop waits before it passes anyway
STALE_AFTER = 5.0  # seconds without a pass after which the loop counts as hung (see the module's docstring)
MIN_PASSES = 3  # stale_after must cover at least this many idle passes


class Heartbeat:
    def __init__(self, stale_after: float = STALE_AFTER, every: float = EVERY) -> None:
        if not (every > 0 and math.isfinite(stale_after) and stale_after >= MIN_PASSES * every):
            raise InputError(
                f"--heartbeat-timeout: {stale_after:g}s must be at least {MIN_PASSES} of the scheduling loop's"
                f" idle passes ({MIN_PASSES} × {every:g}s), or a healthy idle loop is called hung"
            )
        self.stale_after = stale_after
        self.every = every
        # Shared memory (picklable only into a process being started: elector_process.py hands it over).
        self._at = RawValue(ctypes.c_double, 0.0)

    def beat(self) -> None:
        self._at.value = time.monotonic()

    def age(self) -> float | None:
        """Seconds since the last pass; None before the first."""
        at = self._at.value
        return None if at == 0.0 else time.monotonic() - at

    def stale_in(self) -> float | None:
        """Seconds until the loop counts as hung unless it passes (negative: it does); None before the first pass."""
        age = self.age()
        return None if age is None else self.stale_after - age

    def fresh(self) -> bool:
        """The loop has passed, and not longer ago than the bound: the elector may take or keep the lease."""
        age = self.age()
        return age is not None and age <= self.stale_after

    def stale(self) -> bool:
        """The loop passed once and has not since, for longer than the bound: it is hung (/healthz fails)."""
        age = self.age()
        return age is not None and age > self.stale_after
