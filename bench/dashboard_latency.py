"""Dashboard responsiveness on a large cluster: latency of the cluster view's JSON (and of /metrics and a
node view) over real HTTP, against the standard synthetic cluster of design/metrics.md filled by one
scheduling cycle of the standard pod mix. Target: cluster view ≤ 200 ms at 1,000 nodes × 8 GPUs.

Prints exactly one JSON line on stdout:

    .venv/bin/python bench/dashboard_latency.py --nodes 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request

import numpy as np
from prometheus_client import CollectorRegistry

from engine_throughput import build_cluster, draw_pod
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import QueueSpec, QueueTree, Workload
from fairgpu.observe.metrics import SchedulingMetrics
from fairgpu.observe.server import Background, create_app
from fairgpu.observe.source import LiveSource

TENANTS = 20


def timed_get(url: str) -> tuple[float, int]:
    began = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as resp:
        body = resp.read()
    return time.perf_counter() - began, len(body)


def summary(url: str, repeat: int) -> dict[str, float]:
    timed_get(url)  # warm-up: first request pays for imports and connection setup
    runs = [timed_get(url) for _ in range(repeat)]
    ms = sorted(t * 1000 for t, _ in runs)
    return {
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 1),
        "max_ms": round(ms[-1], 1),
        "bytes": runs[-1][1],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=12_000, help="pods submitted before the one cycle that fills")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    nodes = build_cluster(args.nodes)
    tree = QueueTree([QueueSpec(f"tenant-{i:02d}") for i in range(TENANTS)])
    sched = Scheduler(nodes, tree, load_profile("fairgpu"))
    for i in range(args.pods):
        sched.submit(Workload(f"w-{i}", f"tenant-{i % TENANTS:02d}", (draw_pod(rng),), 0.0, duration=3600.0))
    registry = CollectorRegistry()
    metrics = SchedulingMetrics(registry)
    began = time.perf_counter()
    result = sched.cycle(0.0)
    metrics.on_cycle(sched, result, 0.0, time.perf_counter() - began)
    source = LiveSource.of(sched, f"synthetic-{args.nodes}", clock=lambda: 0.0)
    source.history.sample(0.0, sched)
    with Background(create_app(source, registry)) as bg:
        out = {
            "bench": "dashboard_latency",
            "nodes": args.nodes,
            "gpus": sched.state.total_gpus,
            "pods_placed": len(sched.state.placed_keys()),
            "allocated_gpus": round(sched.state.allocated_gpu_equivalents(), 1),
            "repeat": args.repeat,
            "cluster_view": summary(f"{bg.url}/api/cluster", args.repeat),
            "metrics": summary(f"{bg.url}/metrics", args.repeat),
            "node_view": summary(f"{bg.url}/api/nodes/{nodes[0].name}", args.repeat),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
