"""Reservations that come due: backfill's side of the bargain, and holding on to nodes that drain late.

Work let into reserved nodes because it was expected to end before the holder's start, and still running
when the holder comes due, is evicted then.

Expected ends may be estimates (durations.py), and an estimate can be wrong; without this, one overrunning
job would push the holder (a starving gang, a preemptor) past the start it was promised, and the holder
would re-plan behind whatever came since. Work that ran on those nodes before the reservation was made is
never evicted here: only backfill entered on that promise. A workload with an exact duration (it ends when
it said) is never overdue.
"""

from __future__ import annotations

from fairgpu.framework.engine import CycleResult, Entry
from fairgpu.framework.lookahead import StartPlan
from fairgpu.framework.preempting import Preempting
from fairgpu.framework.reservations import Reservations


def settle_due(
    reservations: Reservations,
    running: dict[str, Entry],
    pending: dict[str, Entry],
    preempting: Preempting,
    now: float,
    result: CycleResult,
) -> None:
    """For each reservation due by `now` whose holder still waits: evict the backfill still on its nodes,
    and keep the nodes held until that backfill is gone (its grace period). A starving holder also keeps its
    nodes while work that ran there before it reserved them overruns its expected end: they are draining,
    and re-planning elsewhere would start the drain over (with estimated ends, again and again)."""
    due = [res for res in reservations.due(now) if res.workload in pending]
    for res in due:
        until, draining = res.fit.at, False
        for entry in running.values():
            if entry.terminating or not res.exclude[[p.node for p in entry.placed]].any():
                continue
            if res.workload not in entry.backfilled:
                # the plan counted on it having left by now
                draining |= not res.fit.waits_for.isdisjoint(entry.workload.pod_names[: len(entry.placed)])
                continue
            held = preempting.accounting.charge_of(entry.workload.pods[: len(entry.placed)])
            reason = f"backfilled past its expected end into the nodes reserved for {res.workload}"
            until = max(until, now + preempting.evict(entry, held, None, res.workload, now, result, reason))
        if res.starving and draining:
            until = max(until, now)
        if until > res.fit.at:
            res.fit = StartPlan(until, res.fit.nodes, res.fit.waits_for)  # still waiting for the same work
