"""CPU time of the `Fragmentation` score plugin per placement, in one cycle of bench/engine_throughput.py.

Times the plugin's four entry points (`generation`, `score`, `learn`, `gpu_order`) with the thread's CPU
clock, from the start of the cycle (building the plugin, which loads its kernels, is left out), and prints
one JSON line: microseconds per placement of each and their sum, and the whole cycle's CPU per placement.
Four timers per placement, so the figures compare two trees run alike, not the benchmark's own rate:

    .venv/bin/python bench/fragmentation_time.py --nodes 5000
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_throughput as bench
from fairgpu.plugins.fragmentation import Fragmentation

ENTRY_POINTS = ("generation", "score", "learn", "gpu_order")


def timed(spent: list[int], method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return method(*args, **kwargs)
        finally:
            spent[0] += time.thread_time_ns() - start

    return call


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--pods", type=int, default=50_000)
    args = p.parse_args()
    spent = {name: [0] for name in ENTRY_POINTS}
    for name in ENTRY_POINTS:
        setattr(Fragmentation, name, timed(spent[name], getattr(Fragmentation, name)))

    def cycle_starts() -> None:  # engine_throughput freezes the heap right before the timed cycle
        for s in spent.values():
            s[0] = 0
        gc.freeze()

    bench.gc = types.SimpleNamespace(freeze=cycle_starts)
    argv = ["--nodes", str(args.nodes), "--pods", str(args.pods), "--single", "--baseline", "none"]
    result = bench.run(bench.parse_args(argv))
    placed = int(str(result["pods_placed"]))
    out = {name: round(s[0] / placed / 1e3, 2) for name, s in spent.items()}
    out["fragmentation_us_per_placement"] = round(sum(out.values()), 2)
    out["cycle_us_per_placement"] = round(float(str(result["cpu_s"])) / placed * 1e6, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
