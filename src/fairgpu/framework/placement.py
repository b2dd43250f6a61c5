"""Placing pods: filter and score one pod against every node at once, then pick its GPUs.

Shared by the scheduling cycle and by dry runs (reservations, explanations, estimated starts), which
pass a view over a copy of the cluster state.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Sequence

import numpy as np

from fairgpu.framework import evaluations as ev
from fairgpu.framework.cardfit import placement_cards
from fairgpu.framework.interfaces import EngineView, ExplainsFilter, FitMask, Profile
from fairgpu.model.node import exclusive_on
from fairgpu.model.pod import PodSpec
from fairgpu.state import ClusterState, Placement


def feasible(pod: PodSpec, view: EngineView, profile: Profile, exclude: np.ndarray | None = None) -> FitMask:
    """The profile's filters applied in order: nodes (and GPU slots) that can take the pod now."""
    nodes = np.ones(view.state.num_nodes, dtype=bool) if exclude is None else ~exclude
    mask = FitMask(nodes=nodes)
    for f in profile.filter:
        f.filter(pod, view, mask)
    return mask


def place_pod(
    pod: PodSpec,
    view: EngineView,
    profile: Profile,
    exclude: np.ndarray | None = None,
    within: np.ndarray | None = None,
    key: str | None = None,
) -> Placement | None:
    """Where the profile would put the pod now (nothing is assigned); None if no node fits. Every node is
    filtered and scored; results of nodes unchanged since the pod's shape was last here are reused.
    `within`: node indices to choose among (a gang's own nodes), else every node not excluded.
    `key`: the pod's ledger key when this is a real attempt to place it, so that score plugins learn from
    it (once per key however often it is tried); a dry run passes none and teaches nothing."""
    st = view.state
    shape = ev.filtered(pod, view, profile)
    if within is not None:  # a few nodes: look only at them
        if exclude is not None:
            within = within[~exclude[within]]
        within = within[shape.nodes[within]]
        if not within.size:
            return None
        _teach(profile, key, pod)
        # One node left to choose (a gang filling the node it is on): its score cannot change the choice, so
        # the scores are not brought up to date now; the next pod that needs them catches up on every node
        # changed since in one call (they are a function of the state, however many placements behind).
        if within.size == 1 or not profile.score:
            node = int(within[0])
        else:
            node = int(within[np.argmax(ev.scored(shape, pod, view, profile)[within])])
    else:
        nodes = shape.nodes if exclude is None else shape.nodes & ~exclude
        # the first node that fits, if any (argmax stops there, where .any() reads on); none in an empty cluster
        if not nodes.size or not nodes[first := int(nodes.argmax())]:
            return None
        _teach(profile, key, pod)
        if profile.score:  # the totals are -inf where the filters refuse a node
            total = ev.scored(shape, pod, view, profile)
            node = int((total if exclude is None else np.where(exclude, -np.inf, total)).argmax())
        else:
            node = first
    if pod.gpu is None:
        return st.placement_for(pod, node, ())
    assert shape.slots is not None, "the Resources filter narrows a GPU pod's slots"
    if pod.per_container:  # HAMi's own card order, container by container
        cards = placement_cards(st, pod, node, shape.slots[node])
        return st.placement_for(pod, node, cards, tuple(g.count for g in pod.gpus))
    slots = shape.slots[node].nonzero()[0]  # one row: np.flatnonzero costs a microsecond more
    for plugin, _ in profile.score:  # the first score plugin with an opinion orders the GPUs
        order = plugin.gpu_order(pod, view, node, slots)
        if order is not None:
            slots = order
            break
    return st.placement_for(pod, node, slots[: pod.gpu.count])


def _teach(profile: Profile, key: str | None, pod: PodSpec) -> None:
    """A real attempt that has somewhere to go teaches the score plugins that learn the mix."""
    if key is not None:
        for plugin, _ in profile.score:
            # a Learns plugin, found by its method: isinstance against a Protocol costs ~10 % of a cycle
            learn = getattr(plugin, "learn", None)
            if learn is not None:
                learn(key, pod)


def place_all(
    pods: Sequence[PodSpec],
    keys: Sequence[str],
    view: EngineView,
    profile: Profile,
    exclude: np.ndarray | None = None,
    learn: bool = False,
) -> list[Placement]:
    """Assign pods in order until one does not fit; returns the placements made (a prefix of pods).
    `learn`: a real attempt, not a dry run (place_pod's `key`).

    In a gang profile, a gang's pods go to the nodes it already uses while they have room, so it spans
    as few nodes as the scores allow (fewer cross-node hops for distributed training); without one, each
    pod is placed on its own, as kube-scheduler does."""
    placed: list[Placement] = []
    used: list[int] = []  # the nodes the gang took so far, ascending
    within: np.ndarray | None = None  # the same as an array, made again only after a node joins
    for pod, key in zip(pods, keys, strict=True):
        teach = key if learn else None
        p = None
        if placed and profile.gang:
            if within is None:
                within = np.array(used)
            p = place_pod(pod, view, profile, exclude, within, teach)
        if p is None:
            p = place_pod(pod, view, profile, exclude, key=teach)
        if p is None:
            break
        if p.node not in used:
            bisect.insort(used, p.node)
            within = None
        view.state.assign(key, p)
        placed.append(p)
    return placed


def filter_breakdown(pod: PodSpec, view: EngineView, profile: Profile) -> tuple[int, Counter[str]]:
    """(nodes that fit, why each other node does not), each node counted under the first reason."""
    remaining = np.ones(view.state.num_nodes, dtype=bool)
    why: Counter[str] = Counter()
    for f in profile.filter:
        if isinstance(f, ExplainsFilter):
            bad = f.reasons(pod, view)
        else:
            mask = FitMask(nodes=remaining.copy())
            f.filter(pod, view, mask)
            bad = [(f.NAME, ~mask.nodes)]
        for reason, excluded in bad:
            newly = remaining & excluded
            if newly.any():
                why[reason] += int(newly.sum())
                remaining &= ~excluded
    fits = feasible(pod, view, profile).nodes
    if (remaining & ~fits).any():  # each need is met on its own, but not by the same free GPUs
        why["no set of free GPUs meets every need"] += int((remaining & ~fits).sum())
        remaining &= fits
    return int(remaining.sum()), why


# Why a pod fits nowhere, in the categories of the FGD paper's failure breakdown (Weng et al., Fig. 9(c))
UNPLACED_CAUSES = (
    "no GPU capacity left",
    "no allowed GPU model has room",
    "too few GPUs on one node",
    "fragmentation",
    "CPU",
    "memory",
    "GPU memory or task limit",
)


def unplaced_cause(pod: PodSpec, state: ClusterState) -> str:
    """The first of UNPLACED_CAUSES that rules out every node, for a pod no node can take now: the cluster's
    free GPU capacity (or that of the models the pod allows) is short of its request; else no node has its
    GPUs free at once (k GPUs on one node; for one GPU, free capacity only in pieces too small); else every
    node with those GPUs lacks CPU, else memory."""
    st = state
    cpu, mem = st.cpu_free >= pod.cpu_m, st.mem_free >= pod.memory_mib
    if pod.gpu is None:
        return "CPU" if not (st.schedulable & cpu).any() else "memory"
    g = pod.gpu
    usable = st.gpu_usable & st.schedulable[:, None]
    free = np.where(usable, st.gpu_cores_free, 0)
    if int(free.sum()) < g.count * g.cores:
        return "no GPU capacity left"
    allowed = st.model_slots(pod.allows_model) & usable
    if int(free[allowed].sum()) < g.count * g.cores:
        return "no allowed GPU model has room"
    if st.takes_whole_cards(g):
        room = allowed & st.gpu_idle
    else:  # shares, but cores 100 still wants a 100-core card of a mixed cluster to itself
        room = allowed & ~st.gpu_exclusive & (st.gpu_cores_free >= max(g.cores, 1))
        room &= ~exclusive_on(g.cores, st.gpu_whole) | (st.gpu_tasks == 0)
    hosts = room.sum(axis=1) >= g.count
    if not hosts.any():
        return "too few GPUs on one node" if g.count > 1 else "fragmentation"
    if not (hosts & cpu).any():
        return "CPU"
    if not (hosts & cpu & mem).any():
        return "memory"
    return "GPU memory or task limit"
