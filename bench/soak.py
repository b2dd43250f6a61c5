"""The long chaos soak (issue 11, item 8): two replicas, ~2,000 pods, an unreliable API server, leader
kills and node deletions, audited from the fake's own history (tests/chaos.py). One JSON line per seed
with the violation counts and the faults injected, then a summary line.

    python bench/soak.py --seeds 10 --pods 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos import Chaos, run_chaos
from fakeapi.server import FakeApiServer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--arrival", type=float, default=60.0, help="seconds over which the pods arrive")
    ap.add_argument("--limit", type=float, default=240.0, help="hard bound on one run, seconds")
    args = ap.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    totals: dict[str, int] = {}
    faults: dict[str, int] = {}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        fake = FakeApiServer().start()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                chaos = Chaos(seed=seed, nodes=args.nodes, pods=args.pods, arrival_s=args.arrival, limit_s=args.limit)
                report = asyncio.run(run_chaos(fake, fake.kubeconfig(f"{tmp}/kc"), chaos))
        finally:
            fake.stop()
        print(json.dumps(report), flush=True)
        for k, v in report["violations"].items():
            totals[k] = totals.get(k, 0) + v
        for k, v in report["faults"].items():
            faults[k] = faults.get(k, 0) + v
    print(json.dumps({"seeds": args.seeds, "violations": totals, "faults": faults}))


if __name__ == "__main__":
    main()
