"""Live binding against the wire-level fake apiserver: binds/s with concurrent binding, and event-to-bind
latency (pod seen by the informer → Binding accepted). Prints one JSON line.

    python bench/live_bind.py --nodes 100 --pods 2000

The fake apiserver runs in its own process and plays HAMi's device plugin (it consumes each allocation and
releases the node lock as the bind lands); fake and scheduler share this machine, and both are Python.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import numpy as np

from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES, Kind
from test_live_scheduling import node, pod


async def bench(kubeconfig: str, nodes: int, pods: int, trickle: int, rate: float) -> dict:
    port = await KubeClient.connect(kubeconfig)
    for i in range(nodes):
        await port.create(NODES, node(i))
    await port.create(Kind("", "v1", "namespaces", False), {"metadata": {"name": "bench"}})
    await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["bench"]}})
    frac = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "10", "nvidia.com/gpumem": "4000"}
    sem = asyncio.Semaphore(32)

    async def create(i: int) -> None:
        async with sem:
            await port.create(PODS, pod("bench", f"p{i}", frac), "bench")

    await asyncio.gather(*(create(i) for i in range(pods)))
    ctl = Controller(port, load_profile("fairgpu"))
    start = time.perf_counter()
    run = asyncio.create_task(ctl.run())
    while ctl.stats.binds < pods:
        await asyncio.sleep(0.01)
    bulk_s = time.perf_counter() - start
    # Latency on a cluster with room: pods arrive at a steady rate and each is bound on its own.
    ctl.stats.bind_latency.clear()
    for i in range(trickle):
        await port.create(PODS, pod("bench", f"t{i}", frac), "bench")
        await asyncio.sleep(1 / rate)
    while ctl.stats.binds < pods + trickle:
        await asyncio.sleep(0.01)
    lat = np.array(ctl.stats.bind_latency) * 1000
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    await port.close()
    return {
        "bench": "live_bind",
        "nodes": nodes,
        "gpus": nodes * 8,
        "pods": pods,
        "binds_per_s": round(pods / bulk_s, 1),
        "bulk_seconds": round(bulk_s, 2),
        "latency_pods": trickle,
        "arrival_rate_per_s": rate,
        "event_to_bind_ms_p50": round(float(np.percentile(lat, 50)), 1),
        "event_to_bind_ms_p99": round(float(np.percentile(lat, 99)), 1),
        "bind_failures": ctl.stats.bind_failures,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--trickle", type=int, default=200, help="pods for the latency phase")
    ap.add_argument("--rate", type=float, default=50.0, help="arrivals per second in the latency phase")
    args = ap.parse_args()
    tests = Path(__file__).resolve().parent.parent / "tests"
    # The fake apiserver (which also plays HAMi's device plugin) runs in its own process.
    fake = subprocess.Popen(
        [sys.executable, "-m", "fakeapi"], cwd=tests, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        url = fake.stdout.readline().strip()  # type: ignore[union-attr]
        control = urllib.request.Request(
            f"{url}/_fake/device-plugin", data=b"{}", method="POST", headers={"X-Fake-Control": "yes"}
        )
        urllib.request.urlopen(control, timeout=10).close()
        with tempfile.TemporaryDirectory() as tmp:
            kc = Path(tmp) / "kc"
            kc.write_text(
                json.dumps(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [{"name": "fake", "cluster": {"server": url}}],
                        "users": [{"name": "u", "user": {}}],
                        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
                        "current-context": "fake",
                    }
                )
            )
            print(json.dumps(asyncio.run(bench(str(kc), args.nodes, args.pods, args.trickle, args.rate))))
    finally:
        fake.stdin.close()  # type: ignore[union-attr]
        fake.wait(10)


if __name__ == "__main__":
    main()
