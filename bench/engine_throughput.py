"""Engine throughput and decision latency, by the protocol of design/metrics.md ("Throughput and latency").

Builds the standard synthetic cluster (N nodes × 8 GPUs of mixed models with 80/40/24 GiB, 128 CPU cores
and 1 TiB memory each) and the standard pod mix (60 % one whole GPU, 15 % 2–8 whole GPUs, 25 % fractional
with gpucores 10–50 % and gpumem 2–20 GiB; 10 % of workloads gangs of 2–16 pods of one shape; equal-weight
tenants), submits every pod before timing (queue full, no arrivals pacing), then drives one scheduling
cycle step by step and times each step (one workload attempt) with time.perf_counter(). The engine scores
every node for every pod; nothing is sampled.

The cluster fills long before 50,000 pods are placed: the cycle goes on through the rest of the queue until
every shape has failed, and that work is measured too, so `pods_placed` is reported beside the rate.

Each attempt is timed as what it was: it placed pods, it failed after filtering and scoring the cluster
(or after a preemption search), or the cycle's memo skipped it (a shape that already failed this cycle);
each kind has its own p50/p99, and `decision_p50_ms`/`decision_p99_ms` cover only the first two. The
profile and a baseline (kube-default) run one after the other, each in its own process, `--runs` times;
the JSON gives both, their medians, and the median same-run ratio. Prints exactly one JSON line:

    .venv/bin/python bench/engine_throughput.py --nodes 5000 --pods 50000 --runs 3
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.model import GpuDevice, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload, gpu_request

GIB_MIB = 1024
GPUS_PER_NODE = 8
NODE_CPU_M = 128_000  # 128 cores
NODE_MEMORY_MIB = 1024 * GIB_MIB  # 1 TiB
GPU_MODELS = (("A100-80GB", 80 * GIB_MIB), ("A100-40GB", 40 * GIB_MIB), ("A10-24GB", 24 * GIB_MIB))

# Per-pod CPU/memory: modest, so GPUs run out first. A whole-GPU node holds at most 8 × 4 cores and
# 8 × 32 GiB; a fully shared node at most 8 GPUs × 10 tasks (HAMi's split count) × 1 core and 8 GiB.
CPU_M_PER_GPU, MEM_MIB_PER_GPU = 4_000, 32 * GIB_MIB
CPU_M_SHARED, MEM_MIB_SHARED = 1_000, 8 * GIB_MIB

P_WHOLE_ONE, P_WHOLE_MANY = 0.60, 0.15  # the rest (25 %) fractional
P_GANG = 0.10
GANG_SIZE = (2, 16)
MULTI_GPU = (2, 8)
FRACTION_CORES = (10, 50)  # percent of one GPU
FRACTION_MEM_GIB = (2, 20)


def build_cluster(n: int) -> list[NodeSpec]:
    nodes = []
    for i in range(n):
        model, mem = GPU_MODELS[i % len(GPU_MODELS)]
        name = f"node-{i:05d}"
        gpus = tuple(GpuDevice(model, mem, uuid=f"GPU-{name}-{j}") for j in range(GPUS_PER_NODE))
        nodes.append(NodeSpec(name=name, cpu_m=NODE_CPU_M, memory_mib=NODE_MEMORY_MIB, gpus=gpus))
    return nodes


def draw_pod(rng: np.random.Generator) -> PodSpec:
    """One pod of the standard mix, with its GPU request given the way a user writes it for HAMi."""
    u = rng.random()
    if u < P_WHOLE_ONE + P_WHOLE_MANY:
        count = 1 if u < P_WHOLE_ONE else int(rng.integers(MULTI_GPU[0], MULTI_GPU[1] + 1))
        gpu = gpu_request({r.GPU: count})
        return PodSpec(cpu_m=CPU_M_PER_GPU * count, memory_mib=MEM_MIB_PER_GPU * count, gpu=gpu)
    cores = int(rng.integers(FRACTION_CORES[0], FRACTION_CORES[1] + 1))
    mem_gib = int(rng.integers(FRACTION_MEM_GIB[0], FRACTION_MEM_GIB[1] + 1))
    gpu = gpu_request({r.GPU: 1, r.GPUCORES: cores, r.GPUMEM: mem_gib * 1024})
    return PodSpec(cpu_m=CPU_M_SHARED, memory_mib=MEM_MIB_SHARED, gpu=gpu)


def build_queues(leaves: int, depth: int, rng: np.random.Generator) -> tuple[list[str], QueueTree]:
    """`leaves` tenant queues; with depth > 1, under a tree of organisations (weights 1–4) that many levels
    deep, each inner queue with about the same number of children."""
    names = [f"tenant-{i:03d}" for i in range(leaves)]
    if depth <= 1:
        return names, QueueTree([QueueSpec(name=q, weight=1.0) for q in names])
    fanout = max(2, round(leaves ** (1 / depth)))
    specs: list[QueueSpec] = []
    level = [None]
    for d in range(depth - 1):
        below = []
        for parent in level:
            for k in range(fanout):
                name = f"org-{d}-{len(specs):03d}" if parent is None else f"{parent}.{k}"
                specs.append(QueueSpec(name=name, weight=float(rng.integers(1, 5)), parent=parent))
                below.append(name)
        level = below
    specs += [
        QueueSpec(name=q, weight=float(rng.integers(1, 5)), parent=level[i % len(level)]) for i, q in enumerate(names)
    ]
    return names, QueueTree(specs)


def build_workloads(pods: int, queues: list[str], rng: np.random.Generator) -> list[Workload]:
    """Workloads of the standard mix totalling exactly `pods` pods (the last gang is cut to fit)."""
    out: list[Workload] = []
    left = pods
    while left > 0:
        size = int(rng.integers(GANG_SIZE[0], GANG_SIZE[1] + 1)) if rng.random() < P_GANG else 1
        size = min(size, left)
        pod = draw_pod(rng)
        queue = queues[int(rng.integers(len(queues)))]
        out.append(Workload(name=f"wl-{len(out):06d}", queue=queue, pods=(pod,) * size))
        left -= size
    return out


def percentile_ms(values: list[float], pct: float) -> float:
    return float(np.percentile(values, pct)) * 1e3 if values else 0.0


def latency(values: list[float]) -> dict[str, float | int]:
    return {
        "count": len(values),
        "p50_ms": round(percentile_ms(values, 50), 4),
        "p99_ms": round(percentile_ms(values, 99), 4),
        "max_ms": round(max(values) * 1e3, 4) if values else 0.0,
    }


def run(args: argparse.Namespace) -> dict[str, object]:
    """One cycle of one profile in this process."""
    rng = np.random.default_rng(args.seed)
    queue_names, tree = build_queues(args.queues, args.depth, rng)
    nodes = build_cluster(args.nodes)
    workloads = build_workloads(args.pods, queue_names, rng)
    profile = load_profile(args.profile)

    sched = Scheduler(nodes, tree, profile)
    t = time.perf_counter()
    for wl in workloads:
        sched.submit(wl)
    submit_s = time.perf_counter() - t
    # A long-running driver freezes its bulk-loaded objects so the collector does not rescan them
    # mid-cycle (otherwise one decision in thousands pays a ~80 ms full collection).
    gc.freeze()

    result = CycleResult()
    # One entry per attempt (the engine's time from one yield to the next), by what the attempt was: it
    # placed pods; it filtered and scored the cluster (or searched for victims) and placed nothing; or the
    # cycle's memo answered it (its shape already failed, or its queue's admission refused that shape).
    kinds: dict[str, list[float]] = {"placed": [], "failed": [], "skipped": []}
    bound = evaluated = searches = 0
    cpu0 = time.process_time()
    start = last = time.perf_counter()
    for _ in sched.steps(0.0, result):
        now = time.perf_counter()
        if len(result.bound) > bound:
            kind = "placed"
        elif result.evaluated > evaluated or result.searches > searches:
            kind = "failed"
        else:
            kind = "skipped"
        kinds[kind].append(now - last)
        bound, evaluated, searches = len(result.bound), result.evaluated, result.searches
        last = now
    end = time.perf_counter()
    cpu_s = time.process_time() - cpu0
    engine_s = end - start  # every moment of the cycle is engine work, its epilogue included

    placed = len(result.bound)
    gpus = sched.state.total_gpus
    peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    decisions = kinds["placed"] + kinds["failed"]
    return {
        "placements_per_s": round(placed / engine_s, 1) if engine_s > 0 else 0.0,
        # The same rate over the process's CPU time in the cycle: steadier on a shared, busy machine.
        "placements_per_cpu_s": round(placed / cpu_s, 1) if cpu_s > 0 else 0.0,
        # real decisions (placed or failed after evaluation); skips are reported apart
        "decision_p50_ms": round(percentile_ms(decisions, 50), 4),
        "decision_p99_ms": round(percentile_ms(decisions, 99), 4),
        "placed": latency(kinds["placed"]),
        "failed_after_evaluation": latency(kinds["failed"]),
        "cache_skips": latency(kinds["skipped"]),
        "preemption_searches": result.searches,
        "peak_rss_mib": round(peak_rss_kib / 1024, 1),
        "nodes": args.nodes,
        "gpus": gpus,
        "pods": args.pods,
        "workloads": len(workloads),
        "queues": args.queues,
        "depth": args.depth,
        "profile": args.profile,
        "seed": args.seed,
        "pods_placed": placed,
        "workloads_started": len(result.started),
        "attempts": result.attempts,
        "gpu_allocated_pct": round(100.0 * sched.state.allocated_gpu_equivalents() / max(1, gpus), 2),
        "engine_s": round(engine_s, 4),
        "cpu_s": round(cpu_s, 4),
        "submit_s": round(submit_s, 4),
    }


def child(argv: list[str], profile: str) -> dict[str, object]:
    """One run in a fresh process, so each profile's peak RSS is its own and neither inherits the other's
    heap."""
    cmd = [sys.executable, __file__, *argv, "--profile", profile, "--baseline", "none", "--runs", "1", "--single"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out))


RATIOS = ("placements_per_s", "placements_per_cpu_s")


def compare(argv: list[str], args: argparse.Namespace) -> dict[str, object]:
    """`runs` rounds of the profile then the baseline, each in its own process; per round the ratio of the
    two (same machine load), and the medians over the rounds."""
    rounds = []
    for _ in range(args.runs):
        ours = child(argv, args.profile)
        base = child(argv, args.baseline) if args.baseline != "none" else None
        ratio = {k: round(float(ours[k]) / float(base[k]), 3) for k in RATIOS if base and base[k]} if base else {}
        rounds.append({"profile": ours, "baseline": base, "ratio": ratio})
    out: dict[str, object] = {"nodes": args.nodes, "pods": args.pods, "runs": args.runs}
    for side, name in (("profile", args.profile), ("baseline", args.baseline)):
        if rounds[0][side] is None:
            continue
        runs = [rd[side] for rd in rounds]
        out[name] = {
            "median": {k: round(statistics.median(float(r[k]) for r in runs), 4) for k in (*RATIOS, *MEDIANS)},
            "runs": runs if args.runs > 1 else runs[0],
        }
    if rounds[0]["ratio"]:
        out["ratio_same_run"] = {k: round(statistics.median(float(rd["ratio"][k]) for rd in rounds), 3) for k in RATIOS}
    return out


# figures given as medians over the runs (placements per s and per CPU-s besides)
MEDIANS = ("decision_p50_ms", "decision_p99_ms", "peak_rss_mib", "pods_placed")


def workload_args(p: argparse.ArgumentParser) -> None:
    """The cluster, pod mix and queue tree, shared with bench/slow_decisions.py so both time the same work."""
    p.add_argument("--nodes", type=int, default=1000, help="nodes of 8 GPUs each (default 1000)")
    p.add_argument("--pods", type=int, default=50_000, help="pending pods, gangs included (default 50000)")
    p.add_argument("--profile", default="fairgpu", help="built-in profile or YAML path (default fairgpu)")
    p.add_argument("--seed", type=int, default=0, help="numpy default_rng seed (default 0)")
    p.add_argument("--queues", type=int, default=20, help="tenant (leaf) queues (default 20)")
    p.add_argument("--depth", type=int, default=1, help="levels of the queue tree (default 1: flat, equal weights)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    workload_args(p)
    p.add_argument("--baseline", default="kube-default", help="profile run beside it, same load (none: skip)")
    p.add_argument("--runs", type=int, default=1, help="rounds of profile + baseline; figures are medians")
    p.add_argument("--single", action="store_true", help=argparse.SUPPRESS)  # one run, in this process
    args = p.parse_args(argv)
    for name in ("nodes", "pods", "queues", "runs"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.single:
        print(json.dumps(run(args)), flush=True)
        return 0
    # the child gets the same cluster arguments; its own --profile/--baseline/--runs come last and win
    print(json.dumps(compare(argv, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
