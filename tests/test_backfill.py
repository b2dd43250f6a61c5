"""Backfill into room held for a starving gang: short work uses it, nothing delays the gang's start."""

from __future__ import annotations

from conftest import gpu_node, whole
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import QueueSpec, QueueTree
from fairgpu.model.pod import Workload


def wl(name: str, queue: str, gpus: int, duration: float, t: float = 0.0) -> Workload:
    return Workload(name, queue, (whole(gpus),), submit_time=t, duration=duration)


def test_short_job_behind_a_long_one_backfills_and_the_gang_starts_when_reserved():
    nodes = [gpu_node("n0"), gpu_node("n1")]
    queues = QueueTree([QueueSpec("stream"), QueueSpec("training", starvation_after=0)])
    s = Scheduler(nodes, queues, load_profile("fairgpu"))
    for name, node, slots, duration in (("a", 0, range(4), 20), ("b", 0, range(4, 8), 100), ("c", 1, range(8), 1000)):
        w = wl(name, "stream", len(slots), duration)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, slots)], started=0.0)
    s.submit(wl("gang", "training", 8, 3600))
    s.cycle(0)
    (res,) = s.reservations.values()
    assert res.workload == "gang" and res.fit.at == 100 and list(res.fit.nodes) == [0]  # n0 frees first
    # In the stream's FIFO order: one too long to end before the gang's start, one ending 10 s after it,
    # then one that ends 30 s before it: only that one may use the held node.
    s.submit(wl("long", "stream", 1, 500, t=1))
    s.submit(wl("late", "stream", 1, 90, t=2))
    s.submit(wl("short", "stream", 1, 50, t=3))
    s.remove("a")
    assert s.cycle(20).started == ["short"]
    assert s.status("short").placements[0].node == 0
    assert sorted(s.pending) == ["gang", "late", "long"]
    s.remove("short")  # ended at 70
    s.remove("b")
    assert s.cycle(100).started[0] == "gang"  # at the reserved time: the backfill delayed nothing
