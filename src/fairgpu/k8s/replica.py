"""One replica's life: its controller and (with leader election) its elector run together until one of them
ends or the replica is stopped (`fairgpu run` on SIGTERM or Ctrl-C).

A graceful stop hands the lease over at once, as client-go's ReleaseOnCancel does, and in the order that
keeps two leaders from binding at once:

1. the fence closes: no Binding, Eviction or other write of a decision is sent from now on
   (controller.stop_binding, writes.py);
2. those already on the wire are waited for, at most DRAIN_S (each is answered, or given up);
3. the controller stops, then the elector: nothing renews the lease any more;
4. the lease is released (leader.release_lease: only a record naming this replica, only the version read,
   so a record another replica wrote is never overwritten), and a standby takes it at its next attempt.

Step 4 is skipped when such a write of this replica is still on the wire, or one was left without an answer
within the last lease duration: it may still land, and only the lease duration a standby waits out covers
that (as for a killed leader). A hung leader's elector hands the lease over by the same rule (leader.py).
Within the kubelet's default 30 s grace: DRAIN_S, the elector's stop (elector_process.STOP_S) and RELEASE_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from fairgpu.k8s.controller import Controller
from fairgpu.k8s.elector_process import ElectorProcess
from fairgpu.k8s.leader import LeaderElector

log = logging.getLogger(__name__)
DRAIN_S = 5.0  # a write on the wire is answered within this long when the API server is well
RELEASE_S = 5.0  # the release's own requests (retried on 5xx) get this long


async def run_replica(controller: Controller, elector: LeaderElector | ElectorProcess | None) -> None:
    """Run both until one ends (its error is raised) or this is cancelled; either way stop gracefully."""
    tasks = [asyncio.create_task(controller.run())]
    if elector is not None:
        tasks.append(asyncio.create_task(elector.run()))
    try:
        # asyncio.wait, not gather: a cancelled gather cancels its tasks, binds on the wire among them.
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    finally:
        await stop_gracefully(controller, elector, tasks)


async def stop_gracefully(
    controller: Controller, elector: LeaderElector | ElectorProcess | None, tasks: list[asyncio.Task]
) -> bool:
    """Steps 1-4 of the module's docstring; `tasks` are the controller's run() then the elector's. True if the
    lease was released."""
    controller.stop_binding()
    drained = await controller.drained(DRAIN_S)
    for task in tasks:  # the controller first: the lease is renewed while it stops
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    if elector is None:
        return False
    writes = controller.writes
    if not drained or not writes.quiet(elector.lease_duration):
        log.warning(
            "a write may still land (%d unanswered on the wire, the last given up %.1fs ago): the lease is"
            " left to expire",
            writes.sending,
            time.monotonic() - writes.unanswered_at,
        )
        return False
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(RELEASE_S):
            return await elector.release(controller.port)
    log.warning("the lease could not be released within %gs: it is left to expire", RELEASE_S)
    return False
