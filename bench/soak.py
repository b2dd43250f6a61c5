"""The long chaos soak (issue 11, item 8): two replicas, ~2,000 pods, an unreliable API server, leader
kills, node deletions and webhook restarts, audited from the fake's own history (tests/chaos.py,
tests/audit.py), with the fake apiserver in a process of its own. One JSON line per seed with the violation
counts, the faults injected, the run's wall time and the load average at its end, then a summary. `--hogs N`
runs N busy loops beside it (CPU starvation), stopped when the soak ends.

A seed that overruns its --limit by WATCHDOG_S (240 s) (something the run's own bounds did not catch) is killed:
every thread's stack goes to stderr, a line {"seed": N, "hung": true} to stdout, and the exit code is 3.

    python bench/soak.py --seeds 10 --pods 2000
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos import Chaos, run_chaos
from fakeapi.process import FakeProcess

WATCHDOG_S = 240.0  # past the limit: the driver's bound, settling, stopping, the audit's replay


def watchdog(seed: int, after: float) -> threading.Timer:
    def kill() -> None:
        print(json.dumps({"seed": seed, "hung": True, "after_s": after}), flush=True)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(3)

    timer = threading.Timer(after, kill)
    timer.daemon = True
    timer.start()
    return timer


def hogs(n: int, bound: float) -> list[subprocess.Popen]:
    """N busy loops, each ending by itself after `bound` seconds if this process dies without stopping it."""
    loop = f"import time\nend = time.monotonic() + {bound}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--arrival", type=float, default=60.0, help="seconds over which the pods arrive")
    ap.add_argument("--limit", type=float, default=240.0, help="hard bound on one run, seconds")
    ap.add_argument("--hogs", type=int, default=0, help="busy loops run beside the soak")
    ap.add_argument(
        "--lease",
        type=lambda v: tuple(float(x) for x in v.split(",")),
        default=Chaos.lease,
        help="DURATION,RENEW_DEADLINE,RETRY seconds (default the chaos run's short 3,2,0.25; deploy/'s is 15,10,2)",
    )
    ap.add_argument("--elector-process", action="store_true", help="the elector in a process of its own")
    args = ap.parse_args()
    hogging = hogs(args.hogs, args.seeds * (args.limit + WATCHDOG_S + 120))
    try:
        run(args)
    finally:
        for h in hogging:
            h.kill()
            h.wait(10)


def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.CRITICAL)
    totals: dict[str, int] = {}
    faults: dict[str, int] = {}
    pods = binds = unfinished = 0
    seconds = 0.0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        timer = watchdog(seed, args.limit + WATCHDOG_S)
        began = time.monotonic()
        fake = FakeProcess().start()  # its own process: a starved soak process never makes it answer late
        try:
            with tempfile.TemporaryDirectory() as tmp:
                chaos = Chaos(
                    seed,
                    args.nodes,
                    pods=args.pods,
                    arrival_s=args.arrival,
                    limit_s=args.limit,
                    lease=args.lease,
                    elector_process=args.elector_process,
                )
                report = asyncio.run(run_chaos(fake, fake.kubeconfig(f"{tmp}/kc"), chaos))
        finally:
            fake.stop()
            timer.cancel()
        report |= {"wall_s": round(time.monotonic() - began, 1), "load": round(os.getloadavg()[0], 1)}
        print(json.dumps(report), flush=True)
        for k, v in report["violations"].items():
            totals[k] = totals.get(k, 0) + v
        for k, v in report["faults"].items():
            faults[k] = faults.get(k, 0) + v
        pods, binds, seconds = pods + report["pods"], binds + report["binds"], seconds + report["seconds"]
        unfinished += not report["finished"]
    summary = {"seeds": args.seeds, "violations": totals, "faults": faults, "pods": pods, "binds": binds}
    print(json.dumps({**summary, "seconds": round(seconds, 1), "unfinished": unfinished}))


if __name__ == "__main__":
    main()
