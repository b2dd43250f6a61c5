"""The FGD fill experiment on the Alibaba openb trace (design/metrics.md, "Fragmentation"), every policy ×
seeds 42–51, seeds in parallel processes. Prints one JSON line: wall time, the published medians at
L = 100 beside ours, and each policy's median/min/max unallocated GPU % at every L.

    .venv/bin/python bench/fill_fgd.py [--traces ../shared/traces] [--seeds 42-51] [--policy fgd,fairgpu]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fairgpu.sim.fill import POLICIES, fill_experiment

# Weng et al., USENIX ATC 2023, on openb_pod_list_default.csv at 100 % arrived load (lower is better)
PUBLISHED_L100 = {
    "random": 13.75,
    "dotprod": 9.44,
    "gpu-clustering": 8.42,
    "gpu-packing": 8.19,
    "best-fit": 7.09,
    "fgd": 4.77,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=Path("../shared/traces"))
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--policy", default=",".join(POLICIES))
    args = ap.parse_args()
    folder = args.traces / "alibaba-gpu-v2023-openb"
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    policies = args.policy.split(",")
    start = time.perf_counter()
    doc = fill_experiment(
        folder / "openb_node_list_gpu_node.csv", folder / "openb_pod_list_default.csv", policies, seeds
    )
    wall = time.perf_counter() - start
    at_100 = {p: round(doc["policies"][p]["unallocated_gpu_pct"]["100"]["median"], 2) for p in policies}
    out = {
        "wall_s": round(wall, 1),
        "seeds": seeds,
        "median_at_100": at_100,
        "published_at_100": {p: PUBLISHED_L100[p] for p in policies if p in PUBLISHED_L100},
        "policies": doc["policies"],
    }
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
