"""Preempt plugin: reclaim lent guarantees, restore fair shares, and honour priority inside a queue —
evicting as little work as possible, whole gangs only, and never in a way that could be undone.

Rules (queue policies, design/ARCHITECTURE.md "Tenants: queues"):
- a queue with `preemption: never` triggers no eviction;
- reclaim: a queue still within its guarantee (with the new workload) may evict from queues borrowing
  above theirs; fair share: a queue still at or below its fair share may evict from queues above theirs;
  within the queue: a higher-priority workload may evict the queue's own lower-priority ones;
- protected: workloads younger than their queue's min_runtime, and `preemptible: false` workloads of a
  queue within its guarantee; from fair share (not from reclaim), workloads that have run at least their
  queue's fair_share_max_runtime, which bounds the work such an eviction loses;
- worth it: an eviction for fair share only (not reclaim, not priority) is made only if it gives the
  preemptor's queue more GPU-time within its share than its victims have run (`_worth_it`);
- no ping-pong: afterwards the preemptor's share ratio (usage, past usage included as FairShare counts it,
  over entitlement) must be no higher than each victim queue's, so every eviction strictly reduces
  unfairness and preemption terminates. Reclaim is held to it too: a victim larger than the need frees
  room that the preemptor's queue would borrow back at once, and the victim's queue would then take it
  back by fair share. So a guarantee is not reclaimed from victims much coarser than the ask; it comes
  back as they finish.

Choice: victims come first from the queues furthest above their fair share, then lowest priority, then
least work lost (most recently started); an elastic workload's extra pods go before any whole workload.
Placement-aware: for each pod still to place, the node is chosen where freeing the cheapest GPUs makes it
fit (over the cluster as it would be with every eligible victim gone), and the final set is verified by a
dry-run placement before anything is evicted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fairgpu.fairness import dominant_shares, entitlements, share_ratio
from fairgpu.framework.interfaces import EngineView, PreemptContext
from fairgpu.framework.placement import feasible, place_all, place_pod
from fairgpu.model.pod import PodSpec
from fairgpu.resources import DIM_GPU
from fairgpu.state import scratch_key

_TOL = 1e-9


@dataclass(slots=True)
class Preemption:
    NAME: ClassVar[str] = "Preemption"

    # every queue that may preempt evicts for its fair share too, as if its policy said `fair_share: true`
    # (the engine reads it when it takes the queue tree: Scheduler, framework/preempting.py `share_evicting`)
    fair_share: bool = False

    def preempt(self, ctx: PreemptContext) -> np.ndarray | None:
        view, tree, p = ctx.view, ctx.view.tree, ctx.queue
        policy = tree.queues[p].preemption
        if not policy.enabled:
            return None
        after_p = _ratio(view, p, ctx.usage[p] + ctx.charge)
        eligible, fair_only = self._eligible(ctx, after_p)
        if not eligible.any():
            return None
        chosen = self._choose(ctx, eligible)
        if chosen is None or not _no_ping_pong(ctx, after_p, chosen):
            return None
        if (chosen & fair_only).any() and not _worth_it(ctx, chosen):
            return None
        return np.flatnonzero(chosen)

    def may_find(self, view: EngineView, queue: int, charge: np.ndarray, least_usage: np.ndarray) -> bool:
        """See Preempt.may_find: the queue may take by priority within itself, or by fair share from a share
        ratio it would still be within, or reclaim a guarantee it would still be within (usage only grows
        from `least_usage`, and a share ratio with it, so each test holds for ctx.usage if it fails here)."""
        policy = view.tree.queues[queue].preemption
        if not policy.enabled:
            return False
        if policy.within_queue == "LowerPriority":
            return True
        if policy.fair_share and _ratio(view, queue, least_usage + charge) <= 1.0 + _TOL:
            return True
        return view.tree.reclaims(queue, least_usage, charge)

    @staticmethod
    def _eligible(ctx: PreemptContext, after_p: float) -> tuple[np.ndarray, np.ndarray]:
        """(U,) which victim units this workload's queue may evict, by both queues' policies; and (U,) those
        it may evict only for fair share (not to reclaim a guarantee, nor for priority in its own queue)."""
        view, tree, p = ctx.view, ctx.view.tree, ctx.queue
        policy = tree.queues[p].preemption
        usage = ctx.usage
        within = np.all(usage <= tree.guaranteed + _TOL, axis=1)  # (Q,)
        reclaim = _reclaimable(ctx)
        fair = np.zeros_like(reclaim)
        if policy.fair_share and after_p <= 1.0 + _TOL:
            fair = _ratios(view, usage) > 1.0 + _TOL
        reclaim[p] = fair[p] = False
        if not (reclaim | fair).any() and policy.within_queue != "LowerPriority":
            none = np.zeros(0, dtype=bool)  # no queue it may take from: no need to look at running work
            return none, none
        t = ctx.victims
        ran = ctx.now - t.started
        max_runtime = np.array([q.preemption.fair_share_max_runtime for q in tree.queues])
        other = reclaim[t.queue]
        if policy.within_queue == "LowerPriority":
            other |= (t.queue == p) & (t.priority < ctx.workload.priority)
        ok = other | (fair[t.queue] & (ran < max_runtime[t.queue]))
        min_runtime = np.array([q.preemption.min_runtime for q in tree.queues])
        ok &= ran >= min_runtime[t.queue]
        ok &= ~(t.whole & ~t.preemptible & within[t.queue])  # preemptible: false holds within the guarantee
        eligible: np.ndarray = ok & t.alive
        return eligible, eligible & ~other

    def _choose(self, ctx: PreemptContext, eligible: np.ndarray) -> np.ndarray | None:
        """Pod by pod: the node where the cheapest eligible GPUs make room, the workload's earlier pods
        placed in it first (the room made for one pod is not room for the next); then a verifying dry run."""
        cost = _costs(ctx, eligible)
        chosen = np.zeros(len(eligible), dtype=bool)
        targets: list[tuple[PodSpec, int]] = []  # earlier pods and the node each was given room on
        for pod in ctx.pods:

            def room(
                victims: np.ndarray, copy: bool = False, earlier: tuple[tuple[PodSpec, int], ...] = tuple(targets)
            ) -> AbstractContextManager[EngineView]:
                return _room(ctx, victims, earlier, copy)

            found = self._for_pod(pod, ctx, room, eligible & ~chosen, cost, chosen)
            if found is None:
                return None
            pick, node = found
            chosen |= pick
            targets.append((pod, node))
        return chosen if _verified(ctx, chosen) else None

    @staticmethod
    def _for_pod(
        pod: PodSpec,
        ctx: PreemptContext,
        room: Callable[[np.ndarray, bool], AbstractContextManager[EngineView]],
        rest: np.ndarray,
        cost: np.ndarray,
        chosen: np.ndarray,
    ) -> tuple[np.ndarray, int] | None:
        """The victims (beyond `chosen`) that make room for this pod, and the node they make it on."""
        pick = np.zeros(len(rest), dtype=bool)
        # Fits with the victims already chosen (e.g. where an evicted gang's pod ran), or with none: a gang's
        # first pods may fit in free room, and need no victim (nor have one on that node to take).
        with room(chosen, False) as here:
            there = place_pod(pod, here, ctx.profile, ctx.exclude)
        if there is not None:
            return pick, there.node
        # every eligible victim gone touches every node: a copy, so the live state's caches keep theirs
        with room(chosen | rest, True) as best:
            mask = feasible(pod, best, ctx.profile, ctx.exclude)
        can = mask.nodes
        if not can.any():
            return None
        # Per GPU slot, the cost of the victims holding it; per node, the cheapest slots the pod needs.
        fp, st = ctx.victims.footprint, ctx.view.state
        # An elastic workload's extra pod is in two units: its own and, right before it, its whole workload's.
        # Where both may go, evicting the extra alone frees its room: its rows carry its own cost, less the
        # whole unit's that its duplicate rows there added (else its GPU looked dearer than a whole unit's).
        twin = rest & ~ctx.victims.whole
        twin[1:] &= rest[:-1]
        rows, dup = rest[fp.slot_tag], twin[fp.slot_tag]
        slot_cost = np.zeros(st.gpu_valid.shape)
        np.add.at(slot_cost, (fp.slot_node[rows], fp.slot_idx[rows]), cost[fp.slot_tag[rows]])
        np.add.at(slot_cost, (fp.slot_node[dup], fp.slot_idx[dup]), -cost[fp.slot_tag[dup] - 1])
        need = pod.gpu.count if pod.gpu is not None else 0
        if pod.per_container:  # the mask holds the cards HAMi's Fit takes for all its containers: all needed
            assert mask.slots is not None
            ranked = np.where(mask.slots, slot_cost, 0.0).sum(axis=1)
        elif need:  # only slots that can take the pod there: the earlier pods' own room is taken
            assert mask.slots is not None
            ranked = np.sort(np.where(mask.slots, slot_cost, np.inf), axis=1)[:, :need].sum(axis=1)
        else:
            prow, pdup = rest[fp.pod_tag], twin[fp.pod_tag]
            ranked = np.bincount(fp.pod_node[prow], weights=cost[fp.pod_tag[prow]], minlength=st.num_nodes)
            ranked -= np.bincount(fp.pod_node[pdup], weights=cost[fp.pod_tag[pdup] - 1], minlength=st.num_nodes)
        node = int(np.argmin(np.where(can, ranked, np.inf)))
        others = np.ones(st.num_nodes, dtype=bool)
        others[node] = False
        # Evict the cheapest units holding that node until the pod fits there (dry runs on that node only).
        on_node = np.unique(fp.pod_tag[(fp.pod_node == node) & rest[fp.pod_tag]])
        for u in on_node[np.argsort(cost[on_node], kind="stable")]:
            pick[u] = True
            with room(chosen | pick, False) as dry:
                fits = feasible(pod, dry, ctx.profile, exclude=others).nodes.any()
            if fits:
                return pick, node
        return None


def _ratio(view: EngineView, q: int, usage: np.ndarray) -> float:
    """Queue q's share ratio were it to hold `usage`, past usage included as FairShare's order counts it: by
    another measure a queue the order serves first (little past usage) would be evicted by one it serves
    later, and each start undone at once (decayed-usage: thousands of evictions of work seconds old)."""
    return float(share_ratio(dominant_shares(usage, view.capacity) + view.history_dom[q], view.entitled_dom[q]))


def _ratios(view: EngineView, usage: np.ndarray) -> np.ndarray:
    """(Q,) every queue's share ratio were each to hold its row of `usage`, past usage included (`_ratio`)."""
    return share_ratio(dominant_shares(usage, view.capacity) + view.history_dom, view.entitled_dom)


def _costs(ctx: PreemptContext, eligible: np.ndarray) -> np.ndarray:
    """(U,) eviction cost, lower first: queues furthest above their fair share, then an elastic
    workload's extra pods, then lowest priority, then the least GPU-seconds of work lost."""
    t, view = ctx.victims, ctx.view
    ratio = _ratios(view, ctx.usage)
    queue_rank = np.empty(len(ratio), dtype=np.int64)
    queue_rank[np.argsort(-ratio, kind="stable")] = np.arange(len(ratio))
    _, prio_rank = np.unique(t.priority, return_inverse=True)
    # preempt() chooses only when some victim is eligible, so neither max() below sees an empty array
    levels = int(prio_rank.max()) + 2
    lost = t.charge[:, 0] * np.maximum(ctx.now - t.started, 0.0)
    scale = float(lost[eligible].max()) + 1.0
    tier = (queue_rank[t.queue] * 2 + t.whole) * levels + prio_rank
    cost: np.ndarray = tier * scale + lost
    return cost


def _worth_it(ctx: PreemptContext, chosen: np.ndarray) -> bool:
    """Whether evicting for fair share gives the preemptor's queue more GPU-time within its share than its
    victims have run, which the eviction throws away: (GPUs it asks) x (how long the eviction keeps them with
    its queue, from the preemptor's start once the victims' grace has passed) >= Σ victim GPUs x run so far.
    Both are GPU-seconds, so the rule holds for any workload. How long: until the preemptor would have
    started unaided (as running work ends when expected, behind its queue's work ahead of it), and at least
    until the victims' queue, starting nothing new, would be back within the share it has while the
    preemptor's queue wants all it can hold (`_back_within`), or a victim would have ended, if sooner. Till
    then every GPU that queue frees goes to the queues below their share, so the GPUs the eviction gives are
    GPUs the preemptor's queue would still lack as long as it keeps work waiting (its later work starts one
    turn sooner: judged by the preemptor alone, a queue whose backlog is fed as fast as GPUs free is never
    worth an eviction); a victim's own GPUs would have come to it when the victim ended. No eviction whose
    grace outlasts the preemptor's own wait (it would start sooner without), nor to spare a wait shorter than
    the work it destroys; work of unknown length, or a wait with no end in sight, is worth any eviction the
    other rules allow."""
    t, tree = ctx.victims, ctx.view.tree
    lost = float((t.charge[chosen, DIM_GPU] * np.maximum(ctx.now - t.started[chosen], 0.0)).sum())
    units, queues = np.flatnonzero(chosen).tolist(), np.unique(t.queue[chosen])
    grace = max(tree.queues[int(q)].preemption.grace_period for q in queues)
    start = ctx.now + grace
    unaided = ctx.unaided_start()
    if unaided <= start:
        return False
    back = _back_within(ctx, queues)
    for u in units:
        run = ctx.run_time(t.units[u].workload, int(t.queue[u]))
        if run is not None:
            back = min(back, float(t.started[u]) + run)
    kept = max(unaided, back) - start
    return math.isinf(kept) or float(ctx.charge[DIM_GPU]) * kept >= lost


def _back_within(ctx: PreemptContext, queues: np.ndarray) -> float:
    """The soonest any of these (victim) queues, starting nothing new, holds no more GPUs than its entitlement
    while the preemptor's queue wants all it can hold (every other queue's demand as it is)."""
    v = ctx.view
    demand = v.demand.copy()
    demand[ctx.queue] = v.capacity
    entitled = entitlements(v.tree, v.capacity, demand)[:, DIM_GPU]
    return min(ctx.drained(int(q), float(entitled[q])) for q in queues)


def _reclaimable(ctx: PreemptContext) -> np.ndarray:
    """(Q,) the queues this workload may take lent guarantee back from: those borrowing above their own
    guarantee, if its queue reclaims and stays within its guarantee with the workload."""
    tree, p, usage = ctx.view.tree, ctx.queue, ctx.usage
    if not tree.reclaims(p, usage[p], ctx.charge):
        return np.zeros(len(tree), dtype=bool)
    borrowing: np.ndarray = np.any(usage > tree.guaranteed + _TOL, axis=1)
    return borrowing


def _no_ping_pong(ctx: PreemptContext, after_p: float, chosen: np.ndarray) -> bool:
    """After the evictions, the preemptor's share ratio is no higher than any victim queue's."""
    t, p = ctx.victims, ctx.queue
    for q in np.unique(t.queue[chosen]):
        if q == p:
            continue
        gone = t.charge[chosen & (t.queue == q)].sum(axis=0)
        if after_p > _ratio(ctx.view, int(q), ctx.usage[q] - gone) + _TOL:
            return False
    return True


@contextmanager
def _room(
    ctx: PreemptContext, victims: np.ndarray, earlier: Sequence[tuple[PodSpec, int]], copy: bool
) -> Iterator[EngineView]:
    """The cluster with these victims gone and the workload's earlier pods on the nodes room was made for
    them on: what is left there for its next pod. In place for the block, or on a copy."""
    with nullcontext(ctx.potential(victims)) if copy else ctx.dry_run(victims) as dry:
        for i, (pod, node) in enumerate(earlier):
            elsewhere = np.ones(dry.state.num_nodes, dtype=bool)
            elsewhere[node] = False
            p = place_pod(pod, dry, ctx.profile, elsewhere)
            if p is not None:
                dry.state.assign(scratch_key("preempt", i), p)
        yield dry


def _verified(ctx: PreemptContext, chosen: np.ndarray) -> bool:
    """Dry run: with exactly these victims gone, every pod still to place fits."""
    keys = [scratch_key("preempt", i) for i in range(len(ctx.pods))]
    with ctx.dry_run(chosen) as dry:
        return len(place_all(ctx.pods, keys, dry, ctx.profile, ctx.exclude)) == len(ctx.pods)
