"""What the slow decisions are: one cycle of bench/engine_throughput.py's cluster and pod mix, each real
decision (an attempt that placed pods or failed after evaluation; cache skips left out) tagged with what
happened in it, and the slowest 1 % (the decisions at or above p99) counted by tag.

Tags: `gang` (the attempt bound more than one pod), `new shape` (a pod shape the engine's per-shape cache
did not hold: every node filtered and scored), `rescore` (a score plugin's generation moved, so every node
was scored again: Fragmentation's learned weights changed since the shape was last here), `weights` (the
weights changed during the attempt), `mix` (the learned mix was refreshed: a new shape or a quarter more
pods), `preemption` (a victim search ran). The engine is observed by wrapping its functions here, which
adds a little time to every decision; the tags, not the absolute times, are the point. Prints one JSON line:

    .venv/bin/python bench/slow_decisions.py --nodes 5000 --pods 50000
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_throughput as et
from fairgpu.framework import evaluations as ev
from fairgpu.framework import placement
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.plugins.fragmentation import Fragmentation

_tags: set[str] = set()


def _observe() -> None:
    """Wrap the engine's evaluation steps and the plugin's weight updates to tag the running attempt."""
    filtered, scored = ev.filtered, ev.scored

    def tag_filtered(pod: Any, view: Any, profile: Any) -> Any:
        shapes = profile.evaluations.get(view.state)
        if shapes is None or pod.key() not in shapes:
            _tags.add("new shape")
        return filtered(pod, view, profile)

    def tag_scored(shape: Any, pod: Any, view: Any, profile: Any) -> Any:
        before = shape.generation
        out = scored(shape, pod, view, profile)
        if before and shape.generation != before:
            _tags.add("rescore")
        return out

    placement.ev.filtered, placement.ev.scored = tag_filtered, tag_scored  # type: ignore[assignment]
    reweigh, learn = Fragmentation._reweigh, Fragmentation._learn

    def tag_reweigh(self: Fragmentation, agg: Any) -> None:
        g = self._generation
        reweigh(self, agg)
        if self._generation != g:
            _tags.add("weights")

    def tag_learn(self: Fragmentation, pod: Any) -> None:
        g = self._generation
        learn(self, pod)
        if self._generation != g:
            _tags.add("mix")

    Fragmentation._reweigh, Fragmentation._learn = tag_reweigh, tag_learn  # type: ignore[method-assign]


def run(args: argparse.Namespace) -> dict[str, object]:
    _observe()
    rng = np.random.default_rng(args.seed)
    names, tree = et.build_queues(args.queues, args.depth, rng)
    nodes, workloads = et.build_cluster(args.nodes), et.build_workloads(args.pods, names, rng)
    sched = Scheduler(nodes, tree, et.load_profile(args.profile))
    for wl in workloads:
        sched.submit(wl)
    gc.freeze()
    result = CycleResult()
    decisions: list[tuple[float, frozenset[str]]] = []
    bound = evaluated = searches = 0
    last = time.perf_counter()
    for _ in sched.steps(0.0, result):
        now = time.perf_counter()
        placed = len(result.bound) - bound
        if placed or result.evaluated > evaluated or result.searches > searches:
            tags = set(_tags) | ({"gang"} if placed > 1 else set())
            tags |= {"preemption"} if result.searches > searches else set()
            decisions.append((now - last, frozenset(tags | {"placed" if placed else "failed"})))
        _tags.clear()
        bound, evaluated, searches = len(result.bound), result.evaluated, result.searches
        last = time.perf_counter()
    p99 = float(np.percentile([t for t, _ in decisions], 99))
    kinds: dict[frozenset[str], list[float]] = collections.defaultdict(list)
    for t, tags in decisions:
        kinds[tags].append(t)
    slow = collections.Counter(tags for t, tags in decisions if t >= p99)

    def name(tags: frozenset[str]) -> str:
        return " + ".join(sorted(tags))

    return {
        "nodes": args.nodes,
        "pods": args.pods,
        "profile": args.profile,
        "decisions": len(decisions),
        "p99_ms": round(p99 * 1e3, 3),
        # the slowest 1 %, by kind: how many of them, and how many decisions of that kind there were in all
        "slowest_1pct": {name(k): [n, len(kinds[k])] for k, n in slow.most_common()},
        # every kind: count, median and p99 (ms), heaviest total first
        "kinds": {
            name(k): [len(v), round(float(np.median(v)) * 1e3, 3), round(float(np.percentile(v, 99)) * 1e3, 3)]
            for k, v in sorted(kinds.items(), key=lambda kv: -sum(kv[1]))
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    et.workload_args(p)
    args = p.parse_args(argv)
    print(json.dumps(run(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
