"""QueueSort plugins: which workload is tried next."""

from __future__ import annotations

from dataclasses import dataclass

from fairgpu.framework.interfaces import Candidate, EngineView, QueueSort
from fairgpu.framework.profile import register


def _fifo_key(c: Candidate) -> tuple[float, float, int]:
    return (-c.workload.priority, c.workload.submit_time, c.seq)


@register(QueueSort, "PrioritySort")
@dataclass(slots=True)
class PrioritySort:
    """kube-scheduler's order: highest priority first, then earliest creation, across all tenants."""

    def pick(self, candidates: list[Candidate], view: EngineView) -> int:
        return min(range(len(candidates)), key=lambda i: _fifo_key(candidates[i]))


@register(QueueSort, "FairShare")
@dataclass(slots=True)
class FairShare:
    """The queue with the lowest dominant share of its entitlement goes next; priority only breaks ties
    inside a queue (each candidate is already its queue's highest-priority, oldest workload)."""

    def pick(self, candidates: list[Candidate], view: EngineView) -> int:
        usage, entitled = view.usage_dom, view.entitled_dom

        def key(i: int) -> tuple[float, float, float, int]:
            q = candidates[i].queue
            ratio = usage[q] / entitled[q] if entitled[q] > 0 else float("inf")
            return (ratio, usage[q], *_fifo_key(candidates[i])[1:])

        return min(range(len(candidates)), key=key)
