"""Why a workload is pending, where it stands, and when it should start — in words a user can act on."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from fairgpu.framework import placement as pl
from fairgpu.framework.engine import Engine, Entry
from fairgpu.framework.interfaces import ActiveQueues
from fairgpu.framework.lookahead import Planned, replay
from fairgpu.spec import format_duration
from fairgpu.state import scratch_key

# Dry-running the cluster order stops here: past this many workloads ahead, the exact rank matters little.
MAX_ORDER_STEPS = 10_000


@dataclass(slots=True)
class Explanation:
    workload: str
    queue: str
    state: str  # pending | running
    submitted: float
    started: float | None = None
    reasons: list[str] = field(default_factory=list)
    position_in_queue: int | None = None  # 1 = next in its queue
    queue_pending: int = 0
    position_in_cluster: int | None = None  # 1 = next in the whole cluster; None past MAX_ORDER_STEPS
    cluster_pending: int = 0
    estimated_start: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        submitted = format_duration(self.submitted)
        out = [f"workload {self.workload} (queue {self.queue}): {self.state}, submitted at t={submitted}"]
        if self.started is not None:
            out.append(f"started at t={format_duration(self.started)}")
            return out
        out += [f"- {reason}" for reason in self.reasons]
        out.append(f"position in queue {self.queue}: {self.position_in_queue} of {self.queue_pending}")
        rank = self.position_in_cluster if self.position_in_cluster is not None else f">{MAX_ORDER_STEPS}"
        out.append(f"position in cluster order: {rank} of {self.cluster_pending}")
        when = "unknown" if self.estimated_start is None else f"t={format_duration(self.estimated_start)}"
        out.append(f"estimated start: {when}")
        return out


def explain(sched: Engine, name: str, now: float) -> Explanation:
    """Raises KeyError for a workload the engine does not know (finished, or never submitted)."""
    entry = sched.running.get(name) or sched.pending[name]
    wl = entry.workload
    exp = Explanation(wl.name, wl.queue, "running" if entry.started is not None else "pending", wl.submit_time)
    if entry.started is not None:
        exp.started = entry.started
        return exp
    sched.refresh_shares(now)
    exp.reasons = _reasons(sched, entry, now)
    order = sched.backlogs[entry.queue].ordered()
    exp.position_in_queue = order.index(entry) + 1
    exp.queue_pending = len(order)
    exp.cluster_pending = len(sched.pending)
    ahead = _ahead_in_cluster_order(sched, entry)
    exp.position_in_cluster = None if ahead is None else len(ahead) + 1
    res = sched.reservations.get(name)
    if res is not None:
        exp.estimated_start = res.fit.at
    elif ahead is not None:
        plan = [Planned(e.rest, sched.reservations.durations.of(e.workload, e.queue)) for e in [*ahead, entry]]
        fit = replay(plan, sched.view, sched.profile, now, sched.running_ends())
        exp.estimated_start = None if fit is None else fit.at
    return exp


def queue_places(sched: Engine) -> dict[str, tuple[str, int, int]]:
    """Each pending workload's queue, its place there (1 = next) and the queue's length, without the replays
    `explain` makes: what a waiting pod can be told at once, before its full explanation."""
    out: dict[str, tuple[str, int, int]] = {}
    for backlog in sched.backlogs:
        order = backlog.ordered()
        for i, entry in enumerate(order):
            out[entry.workload.name] = (entry.workload.queue, i + 1, len(order))
    return out


def _reasons(sched: Engine, entry: Entry, now: float) -> list[str]:
    wl, view, profile = entry.workload, sched.view, sched.profile
    out = []
    quota = sched.admission_refusal(entry)
    if quota:
        out.append(f"quota: {quota}")
    rest = wl.pods[len(entry.placed) :]
    fits, why = pl.filter_breakdown(rest[0], view, profile)
    if fits == 0:
        detail = ", ".join(f"{n} {reason}" for reason, n in why.most_common())
        out.append(f"no fit: 0/{view.state.num_nodes} nodes: {detail}")
    elif len(rest) > 1:
        dry = replace(view, state=view.state.copy())
        placed = pl.place_all(rest, [scratch_key("explain", i) for i in range(len(rest))], dry, profile)
        if len(placed) < len(rest):
            out.append(f"gang incomplete: {len(entry.placed) + len(placed)} of {len(wl.pods)} pods fit at once")
    others = [res for res in sched.reservations.values() if res.workload != wl.name]
    if others and not out:
        exclude = sched.reservations.nodes_to_avoid(wl, entry.queue, now)
        if exclude is not None and pl.place_pod(rest[0], view, profile, exclude) is None:
            held = ", ".join(f"{res.workload} until t={format_duration(res.fit.at)}" for res in others)
            out.append(f"reserved for another workload: nodes held for {held}")
    own = sched.reservations.get(wl.name)
    if own is not None:
        held_for = "starving" if own.starving else "preempting"
        out.append(f"{held_for}: {len(own.fit.nodes)} node(s) reserved for it from t={format_duration(own.fit.at)}")
    if not out:
        q = entry.queue
        ratio = view.share_ratio[q]
        out.append(
            f"fair share: waiting for its turn; queue {wl.queue} holds {view.usage_dom[q]:.1%} of the cluster"
            f" (with past usage {view.usage_dom[q] + view.history_dom[q]:.1%}) against an entitlement of"
            f" {view.entitled_dom[q]:.1%}" + ("" if math.isinf(ratio) else f" (ratio {ratio:.2f})")
        )
    return out


def _ahead_in_cluster_order(sched: Engine, target: Entry) -> list[Entry] | None:
    """Dry-run the queue sort, charging each workload as if placed, until the target comes up: the
    workloads that come before it (None if more than MAX_ORDER_STEPS do)."""
    view = sched.view
    dry = replace(view, usage=view.usage.copy(), usage_dom=view.usage_dom.copy(), share_ratio=view.share_ratio.copy())
    orders = {q: b.ordered() for q, b in enumerate(sched.backlogs) if len(b)}
    cursor: Counter[int] = Counter()
    ahead: list[Entry] = []
    active = ActiveQueues(sched.tree, list(orders), lambda q: orders[q][cursor[q]].workload)
    while len(ahead) < MAX_ORDER_STEPS:
        q = sched.profile.queue_sort.pick(active, dry)
        head = orders[q][cursor[q]]
        if head is target:
            return ahead
        ahead.append(head)
        cursor[q] += 1
        if cursor[q] == len(orders[q]):
            active.remove(q)
        dry.add_usage(q, [head.charge])
    return None
