"""Preemption decision latency at scale (issue: ≤ 50 ms p99 at 5,000 nodes × 8 GPUs, 10,000 running pods).

Team b borrows the whole cluster with 4-GPU pods (10,000 of them on 5,000 × 8 GPUs); then team a, which
is guaranteed half the cluster, submits one-GPU and 8-GPU workloads that can only run by reclaiming. One
cycle is driven attempt by attempt; an attempt that ends in evictions is one preemption decision (choose
victims over all running pods, placement-aware, and verify by a dry-run placement), and is timed.

Prints one JSON line:  .venv/bin/python bench/preemption_latency.py --nodes 5000 --decisions 200
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import numpy as np

from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--decisions", type=int, default=200, help="preempting workloads to submit")
    args = p.parse_args()
    nodes = [
        NodeSpec(f"n{i}", 128_000, 1 << 20, tuple(GpuDevice("A100-80GB", 81920, f"GPU-{i}-{j}") for j in range(8)))
        for i in range(args.nodes)
    ]
    gpus = 8 * args.nodes
    guaranteed = r.zeros()
    guaranteed[:] = np.inf
    guaranteed[r.DIM_GPU] = gpus / 2
    tree = QueueTree([QueueSpec("a", guaranteed=guaranteed), QueueSpec("b")])
    sched = Scheduler(nodes, tree, load_profile("fairgpu"))
    four = PodSpec(cpu_m=4000, memory_mib=32768, gpu=GpuRequest(4, 100, 0))
    running = gpus // 4
    for i in range(running):
        sched.submit(Workload(f"b{i}", "b", (four,), submit_time=0, duration=36000, priority=i % 3))
    sched.cycle(0.0)
    assert len(sched.running) == running, "the borrowing team should fill the cluster"
    rng = np.random.default_rng(0)
    for i in range(args.decisions):
        count = 8 if rng.random() < 0.25 else 1
        pod = PodSpec(cpu_m=1000, memory_mib=8192, gpu=GpuRequest(count, 100, 0))
        sched.submit(Workload(f"a{i}", "a", (pod,), submit_time=60, duration=3600))
    gc.collect()
    gc.freeze()
    result = CycleResult()
    times = []
    seen = 0
    t0 = time.perf_counter()
    steps = sched.steps(60.0, result)
    while True:
        start = time.perf_counter()
        try:
            next(steps)
        except StopIteration:
            break
        took = time.perf_counter() - start
        if len(result.evictions) > seen:
            times.append(took)
            seen = len(result.evictions)
    total = time.perf_counter() - t0
    times.sort()
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "gpus": gpus,
                "running_pods": running,
                "decisions": len(times),
                "evictions": len(result.evictions),
                "decision_p50_ms": round(1000 * statistics.median(times), 2) if times else None,
                "decision_p99_ms": round(1000 * times[min(len(times) - 1, int(0.99 * len(times)))], 2)
                if times
                else None,
                "decision_max_ms": round(1000 * times[-1], 2) if times else None,
                "cycle_s": round(total, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
