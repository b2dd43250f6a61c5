"""The writes that carry out the engine's decisions, each sent through the leader fence and counted while on
the wire: Bindings, Evictions, HAMi's pod annotations and node locks, gang marks (binder.py, carryout.py).

Why every one of them: a Binding landing after a standby took over could book a GPU twice; an Eviction
kills a user's job on a decision the new leader did not make; an annotation or node lock overwrites or holds
up what the new leader writes. None is sent unless this replica leads, in the term its loop knows of, with
margin (the fence: carryout.CarryOut.fence). Events and status conditions are reports, not decisions: not
fenced. Nor is the removal of one of our own node locks (it names the lock it removes and its version, so
it never touches what another replica wrote).

Who reads the count: the graceful stop (replica.py) and the elector of a hung loop (leader.py) release the
lease only while no such write is on the wire and none was given up unanswered within a lease duration (it
may still land; only the lease's expiry covers it). The count is in shared memory, so the elector's own
process (elector_process.py) reads it as its thread does.

The order that makes the count safe to read: a write counts itself *before* it passes the fence, and an
elector closes the fence *before* it reads the count (and reads it after a round trip to the API server).
So either the write saw the fence closed and is never sent, or the elector sees it counted.
"""

from __future__ import annotations

import ctypes
import math
import time
from collections.abc import Awaitable, Callable
from multiprocessing.sharedctypes import RawValue
from typing import ParamSpec, TypeVar

from fairgpu.errors import FenceClosed, KubeError

T = TypeVar("T")
P = ParamSpec("P")


def may_have_landed(err: KubeError) -> bool:
    """A failure that does not tell the write was refused: no answer (0), or a 5xx, which the API server also
    answers while the write goes on (its timeout filter's 504; an etcd request that timed out but commits)."""
    return err.code == 0 or err.code >= 500


class Writes:
    def __init__(self) -> None:
        # Shared memory (picklable only into a process being started: elector_process.py hands it over),
        # written by the scheduling loop's thread alone.
        self._sending = RawValue(ctypes.c_long, 0)
        self._unanswered_at = RawValue(ctypes.c_double, -math.inf)  # CLOCK_MONOTONIC

    @property
    def sending(self) -> int:
        """Writes between their fence and their answer now."""
        return int(self._sending.value)

    @property
    def unanswered_at(self) -> float:
        """When a write whose fate is unknown (no answer, a 5xx, or cancelled on the wire) was last given up on."""
        return float(self._unanswered_at.value)

    def quiet(self, within: float) -> bool:
        """No write on the wire, and none given up unanswered within the last `within` seconds: nothing of this
        replica's can land any more (after `within`, a lease duration, a standby acted on an expired lease
        anyway)."""
        return self.sending == 0 and time.monotonic() - self.unanswered_at >= within

    async def send(
        self, fence: Callable[[], None], write: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`write(*args, **kwargs)` if `fence()` lets it (it raises FenceClosed otherwise), counted until it is
        answered."""
        self._sending.value += 1  # first: see the module's docstring
        answered = False
        try:
            fence()
            result = await write(*args, **kwargs)
            answered = True
            return result
        except FenceClosed:
            answered = True  # never sent
            raise
        except KubeError as err:
            answered = not may_have_landed(err)
            raise
        finally:
            self._sending.value -= 1
            if not answered:
                self._unanswered_at.value = time.monotonic()
