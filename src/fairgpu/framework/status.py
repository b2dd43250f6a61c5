"""What a driver or the dashboard may know of one workload, read from the engine's entry."""

from __future__ import annotations

from dataclasses import dataclass

from fairgpu.framework.engine import Entry
from fairgpu.state import Placement


@dataclass(slots=True, frozen=True)
class WorkloadStatus:
    """What a driver or the dashboard may know of one workload (Scheduler.status)."""

    name: str
    queue: str
    state: str  # pending | running
    submitted: float
    started: float | None
    pods: int
    placed: int  # pods placed (all of them once it runs; an elastic one may run with fewer)
    terminating: bool  # being evicted
    pod_names: tuple[str, ...]
    placements: tuple[Placement, ...]  # of its placed pods, in pod order


def status_of(entry: Entry) -> WorkloadStatus:
    """The entry as a driver sees it."""
    wl = entry.workload
    return WorkloadStatus(
        wl.name,
        wl.queue,
        "running" if entry.started is not None else "pending",
        wl.submit_time,
        entry.started,
        len(wl.pods),
        len(entry.placed),
        entry.terminating,
        wl.pod_names,
        tuple(entry.placed),
    )
