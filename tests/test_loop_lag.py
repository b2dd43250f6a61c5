"""The controller's loop stays free while it explains a long backlog: lease renewal, informers and binds
share that loop, and each explanation replays the queue ahead of its workload (0.1–0.25 s each at a few
hundred pending). bench/soak.py at 2,000 pods: the report of every pending workload held the loop for tens
of seconds, the leader's lease lapsed mid-report again and again, and the run never finished."""

from __future__ import annotations

import asyncio
import time

from conftest import fraction, gpu_node, job, tree, whole
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.k8s.controller import REPORT_BUDGET, Controller
from fairgpu.k8s.holdings import Holdings


class NoPort:
    """No pod is in the cache, so the report writes only queue status, here to nowhere."""

    async def patch(self, *args: object, **kw: object) -> dict:
        return {}


def test_explaining_a_long_backlog_never_holds_the_loop():
    async def go() -> tuple[float, float, int, int, float]:
        engine = Scheduler([gpu_node("n0"), gpu_node("n1")], tree("q", "r"), load_profile("fairgpu"))
        ctl = Controller(NoPort(), load_profile("fairgpu"))  # type: ignore[arg-type]
        book = Holdings(engine, lambda: {}, lambda k: False, lambda: None, lambda k: None)
        # 16 GPUs, 200 workloads of whole GPUs, fractions and gangs: most wait, so many that explaining them all at
        # once would hold the loop even where the engine is fast (with 80, a faster engine fell short of that)
        for i in range(200):
            pod = (whole(1), whole(2), fraction(50, 20000))[i % 3]
            wl = job(f"w{i}", "qr"[i % 2], pod, pods=4 if i % 4 == 0 else 1, t=float(i))
            engine.submit(wl)
            book.members[wl.name] = wl.pod_names
        list(engine.steps(1000.0, CycleResult()))
        ctl.engine, ctl.book = engine, book
        pending = len(list(engine.workloads("pending")))
        started = time.perf_counter()
        waiting = engine.workloads("pending")
        engine.explain(waiting[len(waiting) // 2].name, 1000.0)
        one = time.perf_counter() - started  # what a middling explanation costs here
        lag = 0.0

        async def ticker() -> None:
            nonlocal lag
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0)
                now = time.perf_counter()
                lag, last = max(lag, now - last), now

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        started = time.perf_counter()
        await ctl._report(1000.0)
        took = time.perf_counter() - started
        await asyncio.sleep(0)  # the ticker sees the last gap too
        tick.cancel()
        return lag, one, len(ctl.reporter.explained_at), pending, took

    lag, one, explained, pending, took = asyncio.run(asyncio.wait_for(go(), 300))
    assert pending > 40 and pending * one > 5 * (REPORT_BUDGET + one), (pending, one)  # all at once would hold it
    assert lag < 2 * one + 0.05, f"the loop was held for {lag:.2f}s (one explanation: {one:.2f}s)"
    assert 0 < explained < pending, explained  # a budget's worth now, the rest at later passes
    assert took < REPORT_BUDGET + 2 * one + 0.05, took
