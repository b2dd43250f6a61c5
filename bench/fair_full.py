"""Fair and full (issue 17): every built-in scenario and the Philly replay under kube-default and fairgpu.

Prints one JSON line per (scenario, profile): utilisation, fairness error, Jain index, idle GPU-hours by cause
and the longest wait of a gang (a workload of more than one pod), and where the error comes from:
- `error_taken`: time-average of the share leaf queues hold above their entitlement (Σ max(usage − entitled,
  0)): room some queue holds while another is entitled to it. Without eviction it only shrinks as that work ends;
- `error_unused`: half the time-average of the entitlement nobody uses (Σ entitled − Σ usage): idle GPUs some
  queue is entitled to but cannot use yet (a gang waiting for nodes, a reservation, fragments).
  fairness_error = error_taken + error_unused;
- `all_backlogged`: the error and Jain's index over only the time when every leaf queue has pending work (the
  issue's acceptance window), how long that was, and `floor`: the least error any schedule has at those
  instants, given what waits then (LagFloor; docs/metrics.md, "The lag floor").
`--table` prints a Markdown table instead.

    .venv/bin/python bench/fair_full.py --table
    .venv/bin/python bench/fair_full.py --scenario demo --scenario philly
    .venv/bin/python bench/fair_full.py --undeclared-durations   # the engine learns run times per queue
    .venv/bin/python bench/fair_full.py --fair-share-preemption  # every queue evicts for its fair share
    .venv/bin/python bench/fair_full.py --fair-share-preemption --fair-share-max-runtime 30m  # bounded
    .venv/bin/python bench/fair_full.py --borrowed soonest-end  # FairShare's order on borrowed capacity
    .venv/bin/python bench/fair_full.py --long-over-share start  # work-conserving starts above the share
    .venv/bin/python bench/fair_full.py --scenario philly:224 --profile fairgpu  # another size, fairgpu only
    .venv/bin/python bench/fair_full.py --profile fairgpu-reclaim  # fair-share eviction in every queue
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from fairgpu import fairness
from fairgpu.catalog import load_profile
from fairgpu.framework.engine import CycleResult
from fairgpu.framework.scheduler import Scheduler
from fairgpu.plugins.sort import BORROWED, FairShare
from fairgpu.sim.runner import SimResult, Simulation
from fairgpu.sim.scenario import Scenario, builtin_scenarios, load
from fairgpu.sim.traces import load_philly
from fairgpu.spec import parse_duration

PHILLY = Path(__file__).resolve().parents[1] / "../shared/traces/gavel-philly-vc/gavel_philly_vc_seed0.csv"
PROFILES = ("kube-default", "fairgpu")  # run by default; --profile also takes fairgpu-reclaim


GRACE_S = 120.0  # --fair-share-preemption: an evicted pod's notice before its GPUs are free


def scenario(
    name: str, fair_share_preemption: bool = False, max_runtime: float = math.inf
) -> tuple[Scenario, float | None]:
    if name.startswith("philly"):  # philly, or philly:<GPUs> for the same replay on another cluster size
        sc, horizon = load_philly(PHILLY.resolve(), int(name.partition(":")[2] or 256)), 14 * 86400.0
    else:
        sc, horizon = load(name), None
    if fair_share_preemption:  # the same policy on every queue of every scenario, never per file
        policy = {"fair_share": True, "grace_period": GRACE_S, "fair_share_max_runtime": max_runtime}
        sc.queues = [
            replace(q, preemption=replace(q.preemption, **policy)) if q.preemption.enabled else q for q in sc.queues
        ]
    return sc, horizon


class LagFloor:
    """Per instant, each leaf queue's least shortfall below its entitlement that its backlog forces: a queue
    whose whole demand (running + pending) is within its entitlement and that has work waiting is below its
    entitlement by at least its smallest waiting workload, whatever the rest of the schedule. The values of
    the last cycle at an instant are the ones the run's sample holds."""

    def __init__(self, names: list[str]) -> None:
        self.index = {n: i for i, n in enumerate(names)}
        self.at: dict[float, np.ndarray] = {}

    def on_cycle(self, sched: Scheduler, result: CycleResult, now: float, seconds: float) -> None:
        v = sched.view
        gap = np.zeros(len(self.index))
        demand = fairness.dominant_shares(v.demand, v.capacity)
        for q, backlog in enumerate(sched.backlogs):
            if backlog and sched.tree.is_leaf[q] and demand[q] <= v.entitled_dom[q] + 1e-9:
                # a partly placed gang's shortfall is less than its share: count it as none
                smallest = min(0.0 if e.placed else e.share for e in backlog.ordered())
                gap[self.index[sched.tree.queues[q].name]] = smallest
        self.at[now] = gap


class OverStarts:
    """Per instant, each leaf queue's share held by work started above its entitlement: after a cycle, a
    queue that holds more than it is entitled to counts its newest starts of that cycle, up to the excess, as
    started over it. The rest of what a queue holds above its entitlement was started within it and became
    excess only when others' demand grew: no schedule that neither evicts nor knows the future avoids that."""

    def __init__(self, names: list[str]) -> None:
        self.index = {n: i for i, n in enumerate(names)}
        self.over: dict[str, tuple[int, float]] = {}  # running workload → (queue column, its share)
        self.at: dict[float, np.ndarray] = {}

    def on_cycle(self, sched: Scheduler, result: CycleResult, now: float, seconds: float) -> None:
        v = sched.view
        self.over = {n: o for n, o in self.over.items() if n in sched.running}
        excess = (v.usage_dom - v.entitled_dom).tolist()
        for name in reversed(result.started):  # newest first
            e = sched.running.get(name)
            if e is not None and excess[e.queue] > 1e-9:
                self.over[name] = (self.index[sched.tree.queues[e.queue].name], e.share)
                excess[e.queue] -= e.share
        held = np.zeros(len(self.index))
        for col, share in self.over.values():
            held[col] += share
        self.at[now] = held


class Observers:
    """Several cycle observers on one run."""

    def __init__(self, *observers: LagFloor | OverStarts) -> None:
        self.observers = observers

    def on_cycle(self, sched: Scheduler, result: CycleResult, now: float, seconds: float) -> None:
        for o in self.observers:
            o.on_cycle(sched, result, now, seconds)


def jain(x: np.ndarray) -> float:
    denom = len(x) * float((x * x).sum())
    return float(x.sum()) ** 2 / denom if denom > 0 else 0.0


def error_sources(sc: Scenario, res: SimResult, lag: LagFloor, over: OverStarts) -> dict[str, object]:
    """The fairness error split into share taken and entitlement unused, and the error, its lag floor and
    Jain's index over the time every leaf queue was backlogged, from the run's timeline (each sample holds
    until the next)."""
    tl, leaf = res.timeline, np.array(sc.report_tree().is_leaf)
    if not tl.t:
        return {}
    dt = np.diff([*tl.t, res.horizon_s])
    usage, entitled = np.array(tl.share)[:, leaf], np.array(tl.entitled)[:, leaf]
    backlogged = np.array(tl.backlogged)[:, leaf]
    taken = np.clip(usage - entitled, 0.0, None).sum(axis=1)
    unused = 0.5 * (entitled.sum(axis=1) - usage.sum(axis=1))
    every = backlogged.all(axis=1) & (dt > 0)
    window = float(dt[every].sum())
    err = taken + unused
    # Below its entitlement by `gap` in all, the short queues' error is at least half of it, and where the
    # rest of the cluster is in use someone else holds that room: error = Σ shortfalls − ½ · unused entitlement.
    none = np.zeros(len(leaf))  # an instant without a cycle (none expected): no floor claimed
    gaps = np.array([lag.at.get(t, none) for t in tl.t])[:, leaf].sum(axis=1)
    floor = np.maximum(0.5 * gaps, gaps - unused)
    excess = np.clip(usage - entitled, 0.0, None)
    started_over = np.minimum(excess, np.array([over.at.get(t, none) for t in tl.t])[:, leaf]).sum(axis=1)
    # as the run's jain_index: over the queues entitled to something (a queue its limit holds at 0 is not starved)
    jains = np.array([jain(usage[i][entitled[i] > 0] / entitled[i][entitled[i] > 0]) for i in np.flatnonzero(every)])
    return {
        "error_taken": round(float((taken * dt).sum()) / res.horizon_s, 4),
        # of error_taken, the part held by work started above its queue's entitlement (OverStarts)
        "taken_started_over": round(float((started_over * dt).sum()) / res.horizon_s, 4),
        "error_unused": round(float((unused * dt).sum()) / res.horizon_s, 4) + 0.0,  # never -0.0
        "all_backlogged": {
            "window_s": round(window),
            "fairness_error": round(float((err * dt)[every].sum()) / window, 4) if window else None,
            "jain_index": round(float((jains * dt[every]).sum()) / window, 4) if window else None,
            "floor": round(float((floor * dt)[every].sum()) / window, 4) if window else None,
        },
    }


def row(
    name: str,
    profile: str,
    declared: bool = True,
    fair_share_preemption: bool = False,
    max_runtime: float = math.inf,
    borrowed: str = "fifo",
    long_over_share: str = "hold",
) -> dict[str, object]:
    sc, horizon = scenario(name, fair_share_preemption, max_runtime)
    prof = load_profile(profile)
    if isinstance(prof.queue_sort, FairShare):
        prof = replace(prof, queue_sort=replace(prof.queue_sort, borrowed=borrowed, long_over_share=long_over_share))
    sim = Simulation(sc, prof, horizon, declared_durations=declared)
    lag, over = LagFloor(sc.report_tree().names()), OverStarts(sc.report_tree().names())
    sim.observer = Observers(lag, over)
    res = sim.run()
    gangs = [w for w in sc.workloads if len(w.pods) > 1 and w.submit_time <= res.horizon_s]
    waits = [res.starts.get(w.name, res.horizon_s) - w.submit_time for w in gangs]
    lost = sum(float(q["lost_gpu_hours"]) for q in res.queues.values() if q["parent"] is None)
    capacity_h = sum(len(n.gpus) for n in sc.nodes) * res.horizon_s / 3600
    return {
        "scenario": name,
        "profile": profile,
        "utilization": round(res.utilization, 4),
        # what an evicted workload had run is thrown away: allocated, but no use to anyone
        "useful_utilization": round(res.utilization - lost / capacity_h, 4),
        "fairness_error": round(res.fairness_error, 4),
        "jain_index": None if res.jain_index is None else round(res.jain_index, 4),
        "jain_window_s": round(res.jain_window_s),
        "evictions": res.evictions,
        "gang_wait_max_s": round(max(waits), 1) if waits else None,
        "idle_gpu_hours": {k: round(v, 2) for k, v in res.idle_gpu_hours.items() if v >= 0.005},
        "lost_gpu_hours": round(lost, 1),
        **error_sources(sc, res, lag, over),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--scenario", action="append", help="built-in name, 'philly' or 'philly:<GPUs>' (default: all, Philly on 256)"
    )
    ap.add_argument(
        "--profile",
        action="append",
        choices=(*PROFILES, "fairgpu-reclaim"),
        help="only this profile (default: the two above)",
    )
    ap.add_argument("--table", action="store_true", help="one Markdown table instead of JSON lines")
    ap.add_argument("--undeclared-durations", action="store_true", help="the engine is told no run times")
    ap.add_argument("--fair-share-preemption", action="store_true", help="every queue evicts for its fair share")
    ap.add_argument(
        "--fair-share-max-runtime", default=None, help="with it: fair share evicts only work younger than this"
    )
    ap.add_argument("--borrowed", choices=BORROWED, default="fifo", help="FairShare's order on borrowed capacity")
    ap.add_argument(
        "--long-over-share", choices=("hold", "start"), default="hold", help="FairShare's long starts above the share"
    )
    args = ap.parse_args()
    if args.table and args.profile:
        ap.error("--table compares both profiles: leave out --profile")
    names = args.scenario or [*sorted(builtin_scenarios()), "philly"]
    rows = []
    for name in names:
        for profile in args.profile or PROFILES:
            bound = math.inf if args.fair_share_max_runtime is None else parse_duration(args.fair_share_max_runtime)
            rows.append(
                row(
                    name,
                    profile,
                    not args.undeclared_durations,
                    args.fair_share_preemption,
                    bound,
                    args.borrowed,
                    args.long_over_share,
                )
            )
            if not args.table:
                print(json.dumps(rows[-1]), flush=True)
    if args.table:
        print(
            "| scenario | kube util | fairgpu util (useful) | fairness error (taken + unused) | Jain "
            "| all backlogged: error (floor), Jain, window s | evictions (lost GPU-h) | gang wait max s |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for kube, fair in zip(rows[::2], rows[1::2], strict=True):
            every = fair.get("all_backlogged") or {}
            print(
                f"| {fair['scenario']} | {kube['utilization']:.4f} "
                f"| {fair['utilization']:.4f} ({fair['useful_utilization']:.4f}) "
                f"| {fair['fairness_error']:.4f} ({fair.get('error_taken')} + {fair.get('error_unused')}) "
                f"| {fair['jain_index']} | {every.get('fairness_error')} ({every.get('floor')}), "
                f"{every.get('jain_index')}, "
                f"{every.get('window_s')} | {fair['evictions']} ({fair['lost_gpu_hours']}) "
                f"| {fair['gang_wait_max_s']} |"
            )


if __name__ == "__main__":
    main()
