"""Preemption decision latency at scale (issue: every decision ≤ 50 ms at 5,000 nodes × 8 GPUs, 10,000
running pods).

Team b borrows the whole cluster with 4-GPU pods (10,000 of them on 5,000 × 8 GPUs); then team a, which
is guaranteed half the cluster, submits one-GPU and 8-GPU workloads that can only run by reclaiming. One
cycle is driven attempt by attempt, and every attempt that searched for victims is timed: those that
evicted (choose victims over all running pods, placement-aware, verify by a dry-run placement), and those
that found none. The first search builds the victim table and is counted like the rest.

With `--fair-share` team a is guaranteed nothing: the two teams have equal weights, and the profile is
fairgpu-reclaim, so every search is a fair-share eviction judged worth it or not (its costlier rule: when a
team would start unaided, and when the victims' team would be back within its share).

The same submissions under kube-default (no preemption: team a's attempts simply fail to place) run after
it in the same process, so the machine's load is the same for both.

Prints one JSON line:  .venv/bin/python bench/preemption_latency.py --nodes 5000 --decisions 200 [--fair-share]
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import numpy as np

from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload


def figures(times: list[tuple[float, float]]) -> dict[str, float | int | None]:
    """Wall and CPU (`time.process_time`) milliseconds: on a shared machine the wall time of one attempt
    measures the other processes too."""
    if not times:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None, "cpu_p50_ms": None, "cpu_max_ms": None}
    wall, cpu = (np.array(t) * 1e3 for t in zip(*times, strict=True))
    return {
        "count": len(wall),
        "p50_ms": round(float(np.percentile(wall, 50)), 2),
        "p99_ms": round(float(np.percentile(wall, 99)), 2),
        "max_ms": round(float(wall.max()), 2),
        "cpu_p50_ms": round(float(np.percentile(cpu, 50)), 2),
        "cpu_p99_ms": round(float(np.percentile(cpu, 99)), 2),
        "cpu_max_ms": round(float(cpu.max()), 2),
    }


def scenario(nodes_n: int, decisions: int, profile: str, fair_share: bool = False) -> dict[str, object]:
    nodes = [
        NodeSpec(f"n{i}", 128_000, 1 << 20, tuple(GpuDevice("A100-80GB", 81920, f"GPU-{i}-{j}") for j in range(8)))
        for i in range(nodes_n)
    ]
    gpus = 8 * nodes_n
    guaranteed = r.zeros()
    guaranteed[:] = np.inf
    guaranteed[r.DIM_GPU] = gpus / 2
    tree = QueueTree([QueueSpec("a") if fair_share else QueueSpec("a", guaranteed=guaranteed), QueueSpec("b")])
    sched = Scheduler(nodes, tree, load_profile(profile))
    four = PodSpec(cpu_m=4000, memory_mib=32768, gpu=GpuRequest(4, 100, 0))
    running = gpus // 4
    for i in range(running):
        sched.submit(Workload(f"b{i}", "b", (four,), submit_time=0, duration=36000, priority=i % 3))
    sched.cycle(0.0)
    assert len(sched.running) == running, "the borrowing team should fill the cluster"
    rng = np.random.default_rng(0)
    for i in range(decisions):
        count = 8 if rng.random() < 0.25 else 1
        pod = PodSpec(cpu_m=1000, memory_mib=8192, gpu=GpuRequest(count, 100, 0))
        sched.submit(Workload(f"a{i}", "a", (pod,), submit_time=60, duration=3600))
    gc.collect()
    gc.freeze()
    result = CycleResult()
    evicted: list[tuple[float, float]] = []  # (wall, CPU) of searches that evicted
    none: list[tuple[float, float]] = []  # searches that found no victims
    other: list[tuple[float, float]] = []  # attempts without a search (placed, or answered from the memo)
    seen = searches = 0
    t0 = time.perf_counter()
    steps = sched.steps(60.0, result)
    while True:
        start, cpu = time.perf_counter(), time.process_time()
        try:
            next(steps)
        except StopIteration:
            break
        took = (time.perf_counter() - start, time.process_time() - cpu)
        if result.searches > searches:
            (evicted if len(result.evictions) > seen else none).append(took)
        else:
            other.append(took)
        seen, searches = len(result.evictions), result.searches
    total = time.perf_counter() - t0
    gc.unfreeze()
    every = evicted + none
    return {
        "profile": profile,
        "searches": figures(every),
        "first_search_ms": round(every[0][0] * 1e3, 2) if every else None,
        "first_search_cpu_ms": round(every[0][1] * 1e3, 2) if every else None,
        "evicted": figures(evicted),
        "found_none": figures(none),
        "other_attempts": figures(other),
        "evictions": len(result.evictions),
        "cycle_s": round(total, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--decisions", type=int, default=200, help="preempting workloads to submit")
    p.add_argument("--baseline", default="kube-default", help="profile run after it, same load (none: skip)")
    p.add_argument("--fair-share", action="store_true", help="equal teams, fairgpu-reclaim: fair-share evictions")
    args = p.parse_args()
    out: dict[str, object] = {"nodes": args.nodes, "gpus": 8 * args.nodes, "running_pods": 2 * args.nodes}
    profile = "fairgpu-reclaim" if args.fair_share else "fairgpu"
    out[profile] = scenario(args.nodes, args.decisions, profile, args.fair_share)
    if args.baseline != "none":
        out[args.baseline] = scenario(args.nodes, args.decisions, args.baseline, args.fair_share)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
