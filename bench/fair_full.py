"""Fair and full (issue 17): every built-in scenario and the Philly replay under kube-default and fairgpu.

Prints one JSON line per (scenario, profile): utilisation, fairness error, Jain index, idle GPU-hours by cause
and the longest wait of a gang (a workload of more than one pod). `--table` prints a Markdown table instead.

    .venv/bin/python bench/fair_full.py --table
    .venv/bin/python bench/fair_full.py --scenario demo --scenario philly
    .venv/bin/python bench/fair_full.py --undeclared-durations   # the engine learns run times per queue
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fairgpu.catalog import load_profile
from fairgpu.sim.runner import simulate
from fairgpu.sim.scenario import Scenario, builtin_scenarios, load
from fairgpu.sim.traces import load_philly

PHILLY = Path(__file__).resolve().parents[1] / "../shared/traces/gavel-philly-vc/gavel_philly_vc_seed0.csv"
PROFILES = ("kube-default", "fairgpu")


def scenario(name: str) -> tuple[Scenario, float | None]:
    if name == "philly":
        return load_philly(PHILLY.resolve(), 256), 14 * 86400.0
    return load(name), None


def row(name: str, profile: str, declared: bool = True) -> dict[str, object]:
    sc, horizon = scenario(name)
    res = simulate(sc, load_profile(profile), horizon, declared_durations=declared)
    gangs = [w for w in sc.workloads if len(w.pods) > 1 and w.submit_time <= res.horizon_s]
    waits = [res.starts.get(w.name, res.horizon_s) - w.submit_time for w in gangs]
    return {
        "scenario": name,
        "profile": profile,
        "utilization": round(res.utilization, 4),
        "fairness_error": round(res.fairness_error, 4),
        "jain_index": None if res.jain_index is None else round(res.jain_index, 4),
        "jain_window_s": round(res.jain_window_s),
        "evictions": res.evictions,
        "gang_wait_max_s": round(max(waits), 1) if waits else None,
        "idle_gpu_hours": {k: round(v, 2) for k, v in res.idle_gpu_hours.items() if v >= 0.005},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", action="append", help="built-in name or 'philly' (default: all of them)")
    ap.add_argument("--table", action="store_true", help="one Markdown table instead of JSON lines")
    ap.add_argument("--undeclared-durations", action="store_true", help="the engine is told no run times")
    args = ap.parse_args()
    names = args.scenario or [*sorted(builtin_scenarios()), "philly"]
    rows = []
    for name in names:
        for profile in PROFILES:
            rows.append(row(name, profile, not args.undeclared_durations))
            if not args.table:
                print(json.dumps(rows[-1]), flush=True)
    if args.table:
        print("| scenario | kube util | fairgpu util | fairness error | Jain | evictions | gang wait max s |")
        print("|---|---|---|---|---|---|---|")
        for kube, fair in zip(rows[::2], rows[1::2], strict=True):
            print(
                f"| {fair['scenario']} | {kube['utilization']:.4f} | {fair['utilization']:.4f} "
                f"| {fair['fairness_error']:.4f} | {fair['jain_index']} | {fair['evictions']} "
                f"| {fair['gang_wait_max_s']} |"
            )


if __name__ == "__main__":
    main()
