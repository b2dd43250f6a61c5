"""Preempt plugin: reclaim lent guarantees, restore fair shares, and honour priority inside a queue —
evicting as little work as possible, whole gangs only, and never in a way that could be undone.

Rules (queue policies, design/ARCHITECTURE.md "Tenants: queues"):
- a queue with `preemption: never` triggers no eviction;
- reclaim: a queue still within its guarantee (with the new workload) may evict from queues borrowing
  above theirs; fair share: a queue still at or below its fair share may evict from queues above theirs;
  within the queue: a higher-priority workload may evict the queue's own lower-priority ones;
- protected: workloads younger than their queue's min_runtime, and `preemptible: false` workloads of a
  queue within its guarantee;
- no ping-pong: afterwards the preemptor's share ratio (usage over entitlement) must be no higher than
  each victim queue's, so every eviction strictly reduces unfairness and preemption terminates.

Choice: victims come first from the queues furthest above their fair share, then lowest priority, then
least work lost (most recently started); an elastic workload's extra pods go before any whole workload.
Placement-aware: for each pod still to place, the node is chosen where freeing the cheapest GPUs makes it
fit (over the cluster as it would be with every eligible victim gone), and the final set is verified by a
dry-run placement before anything is evicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fairgpu.framework.interfaces import EngineView, Preempt, PreemptContext, VictimUnit
from fairgpu.framework.placement import feasible, place_all
from fairgpu.framework.profile import register
from fairgpu.model.pod import PodSpec

_TOL = 1e-9


@register(Preempt, "Preemption")
@dataclass(slots=True)
class Preemption:
    def preempt(self, ctx: PreemptContext) -> list[VictimUnit]:
        view, tree, p = ctx.view, ctx.view.tree, ctx.queue
        policy = tree.queues[p].preemption
        if not policy.enabled:
            return []
        after_p = _ratio(view, p, view.usage[p] + ctx.charge)
        within_guarantee = bool(np.all(view.usage[p] + ctx.charge <= tree.guaranteed[p] + _TOL))
        eligible = [u for u in ctx.units if self._eligible(u, ctx, within_guarantee, after_p)]
        if not eligible:
            return []
        chosen = self._choose(ctx, eligible)
        if not chosen or not _no_ping_pong(view, p, ctx.charge, after_p, chosen):
            return []
        return chosen

    @staticmethod
    def _eligible(u: VictimUnit, ctx: PreemptContext, within_guarantee: bool, after_p: float) -> bool:
        view, tree = ctx.view, ctx.view.tree
        q, wl, policy = u.queue, u.workload, tree.queues[ctx.queue].preemption
        victim_policy = tree.queues[q].preemption
        if ctx.now - u.started < victim_policy.min_runtime:
            return False
        q_within_guarantee = bool(np.all(view.usage[q] <= tree.guaranteed[q] + _TOL))
        if u.whole and not wl.preemptible and q_within_guarantee:
            return False
        if q == ctx.queue:
            return policy.within_queue == "LowerPriority" and wl.priority < ctx.workload.priority
        borrowing = bool(np.any(view.usage[q] > tree.guaranteed[q] + _TOL))
        reclaim = policy.reclaim and within_guarantee and borrowing
        fair = policy.fair_share and after_p <= 1.0 + _TOL and view.share_ratio[q] > 1.0 + _TOL
        return reclaim or fair

    def _choose(self, ctx: PreemptContext, eligible: list[VictimUnit]) -> list[VictimUnit]:
        """Pod by pod: the node where the cheapest eligible GPUs make room; then a verifying dry run."""
        cost = _costs(ctx, eligible)
        order = np.argsort(cost, kind="stable")
        eligible = [eligible[i] for i in order]
        cost = cost[order]
        chosen: list[VictimUnit] = []
        taken: set[int] = set()
        for pod in ctx.pods:
            pick = self._for_pod(pod, ctx, eligible, cost, taken, chosen)
            if pick is None:
                return []
            for i in pick:
                taken.add(i)
                chosen.append(eligible[i])
        return chosen if _verified(ctx, chosen) else []

    @staticmethod
    def _for_pod(
        pod: PodSpec,
        ctx: PreemptContext,
        eligible: list[VictimUnit],
        cost: np.ndarray,
        taken: set[int],
        chosen: list[VictimUnit],
    ) -> list[int] | None:
        free_now = ctx.potential(chosen)
        if feasible(pod, free_now, ctx.profile).nodes.any():
            return []  # fits with the victims already chosen (e.g. another pod of an evicted gang left)
        rest = [i for i in range(len(eligible)) if i not in taken]
        best = ctx.potential(chosen + [eligible[i] for i in rest])
        can = feasible(pod, best, ctx.profile).nodes
        if not can.any():
            return None
        # Per (node, GPU slot): the cost of the rest's victims holding it; per node, of those on it at all.
        st = best.state
        slot_cost = np.zeros(st.gpu_valid.shape)
        node_cost = np.zeros(st.num_nodes)
        holders: dict[int, list[int]] = {}
        for i in rest:
            for pl in eligible[i].placements:
                holders.setdefault(pl.node, []).append(i)
                node_cost[pl.node] += cost[i]
                for s in pl.slots:
                    slot_cost[pl.node, s] += cost[i]
        need = pod.gpu.count if pod.gpu is not None else 0
        if need:
            ranked = np.sort(np.where(st.gpu_usable, slot_cost, np.inf), axis=1)[:, :need].sum(axis=1)
        else:
            ranked = node_cost
        node = int(np.argmin(np.where(can, ranked, np.inf)))
        # Evict the cheapest holders on that node until the pod fits there (dry runs on the node only).
        pick: list[int] = []
        for i in sorted(set(holders.get(node, [])), key=lambda i: cost[i]):
            pick.append(i)
            trial = ctx.potential(chosen + [eligible[j] for j in pick])
            only_node = np.ones(st.num_nodes, dtype=bool)
            only_node[node] = False
            if feasible(pod, trial, ctx.profile, exclude=only_node).nodes.any():
                return pick
        return None


def _ratio(view: EngineView, q: int, usage: np.ndarray) -> float:
    usable = view.capacity > 0
    dom = float((usage[usable] / view.capacity[usable]).max()) if usable.any() else 0.0
    ent = view.entitled_dom[q]
    return dom / ent if ent > 0 else float("inf")


def _costs(ctx: PreemptContext, units: list[VictimUnit]) -> np.ndarray:
    """Eviction cost, lower first: queues furthest above their fair share, then an elastic workload's
    extra pods, then lowest priority, then the least GPU-seconds of work lost."""
    ratio = ctx.view.share_ratio
    over = sorted({u.queue for u in units}, key=lambda q: -ratio[q])
    rank = {q: i for i, q in enumerate(over)}
    prios = sorted({u.workload.priority for u in units})
    prank = {pr: i for i, pr in enumerate(prios)}
    lost = np.array([u.charge[0] * max(0.0, ctx.now - u.started) for u in units])
    scale = float(lost.max()) + 1.0
    return np.array(
        [
            ((rank[u.queue] * 2 + (1 if u.whole else 0)) * (len(prios) + 1) + prank[u.workload.priority]) * scale
            + lost[i]
            for i, u in enumerate(units)
        ]
    )


def _no_ping_pong(view: EngineView, p: int, charge: np.ndarray, after_p: float, chosen: list[VictimUnit]) -> bool:
    """After the evictions, the preemptor's share ratio is no higher than any victim queue's."""
    removed: dict[int, np.ndarray] = {}
    for u in chosen:
        if u.queue != p:
            removed[u.queue] = removed.get(u.queue, 0) + u.charge
    return all(after_p <= _ratio(view, q, view.usage[q] - gone) + _TOL for q, gone in removed.items())


def _verified(ctx: PreemptContext, chosen: list[VictimUnit]) -> bool:
    """Dry run: with exactly these victims gone, every pod still to place fits."""
    dry = ctx.potential(chosen)
    keys = [f"\0preempt-{i}" for i in range(len(ctx.pods))]
    return len(place_all(ctx.pods, keys, dry, ctx.profile)) == len(ctx.pods)
