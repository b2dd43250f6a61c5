"""Pure fairness math: hierarchical weighted water-filling over dominant (DRF) shares.

Each queue is filled along the direction of its own demand vector, so its allocation keeps its demand's
mix and its dominant share is the scalar being water-filled. Guarantees come first (up to demand), the rest
goes by weight among queues that still want more, capped by limit and demand. When a resource runs out,
the queues that need it stop and the others keep filling (progressive filling), so nothing that some queue
could use is left idle.
"""

from __future__ import annotations

import numpy as np

from fairgpu.model.queue import QueueTree

_EPS = 1e-12


def water_fill(
    capacity: np.ndarray,
    demand: np.ndarray,
    weight: np.ndarray,
    guaranteed: np.ndarray,
    limit: np.ndarray,
) -> np.ndarray:
    """Split `capacity` (R,) among Q siblings with demand/guaranteed/limit (Q, R) and weight (Q,).

    Returns the allocation (Q, R): never above demand or limit, at least min(guarantee, demand) where the
    guarantees fit, and proportional to weight among queues that are all still wanting more.
    """
    demand = np.maximum(np.asarray(demand, dtype=np.float64), 0.0)
    q, _ = demand.shape
    alloc = np.zeros_like(demand)
    if q == 0:
        return alloc
    usable = capacity > _EPS
    norm = np.where(usable, demand / np.where(usable, capacity, 1.0), 0.0)
    impossible = ((demand > _EPS) & ~usable).any(axis=1)  # wants a resource nobody has
    share = np.where(impossible, 0.0, norm.max(axis=1))  # dominant share of each queue's demand
    wants = share > _EPS
    if not wants.any():
        return alloc
    direction = np.where(wants[:, None], norm / np.where(wants, share, 1.0)[:, None], 0.0)
    cap_norm = np.where(usable, 1.0, 0.0)

    def bound(vec: np.ndarray) -> np.ndarray:
        """Largest dominant share x with x·direction ≤ vec (normalised) in every dimension."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(direction > _EPS, (vec / np.where(usable, capacity, 1.0)) / direction, np.inf)
        return ratio.min(axis=1)

    hi = np.where(wants, np.minimum(share, bound(limit)), 0.0)
    lo = np.minimum(hi, np.where(wants, bound(guaranteed), 0.0))
    load_lo = lo @ direction
    over = np.max(np.where(cap_norm > 0, load_lo / np.maximum(cap_norm, _EPS), 0.0))
    if over > 1.0:  # guarantees over-commit this capacity: scale them down together
        lo = lo / over
    w = np.asarray(weight, dtype=np.float64)
    frozen = ~wants | (hi <= lo + _EPS)
    x = lo.copy()
    for _ in range(direction.shape[1] + 1):
        active = ~frozen
        if not active.any():
            break
        base = x[frozen] @ direction[frozen]

        def fill(lam: float, active: np.ndarray = active) -> np.ndarray:
            return np.clip(w[active] * lam, lo[active], hi[active])

        def load(lam: float, active: np.ndarray = active, base: np.ndarray = base) -> np.ndarray:
            return base + fill(lam) @ direction[active]

        lam_max = float(np.max(hi[active] / w[active]))
        if np.all(load(lam_max) <= cap_norm + 1e-9):
            x[active] = fill(lam_max)
            break
        low, high = 0.0, lam_max
        for _ in range(80):
            mid = 0.5 * (low + high)
            if np.all(load(mid) <= cap_norm + 1e-12):
                low = mid
            else:
                high = mid
        x[active] = fill(low)
        saturated = load(low) >= cap_norm - 1e-9
        stops = active & (direction[:, saturated] > _EPS).any(axis=1)
        if not stops.any():  # numerical corner: freeze everyone rather than loop
            stops = active
        frozen = frozen | stops
    alloc = x[:, None] * direction * np.where(usable, capacity, 0.0)
    return np.minimum(alloc, demand)


def entitlements(tree: QueueTree, capacity: np.ndarray, leaf_demand: np.ndarray) -> np.ndarray:
    """Entitlement (Q, R) of every queue, top-down. leaf_demand is (Q, R) with zeros on inner queues."""
    n = len(tree)
    demand = np.array(leaf_demand, dtype=np.float64, copy=True)
    for i in reversed(range(n)):  # children come after parents, so this sums subtrees bottom-up
        p = tree.parent[i]
        if p >= 0:
            demand[p] += demand[i]
    ent = np.zeros_like(demand)
    groups = [(capacity, tree.roots)] + [(None, tree.children[i]) for i in range(n) if tree.children[i]]
    for cap, members in groups:
        if not members:
            continue
        idx = np.array(members)
        parent_cap = capacity if cap is not None else ent[tree.parent[idx[0]]]
        ent[idx] = water_fill(parent_cap, demand[idx], tree.weight[idx], tree.guaranteed[idx], tree.limit[idx])
    return ent


def dominant_shares(vectors: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """max over dimensions of vector / capacity (dimensions with no capacity are ignored)."""
    usable = capacity > _EPS
    if not usable.any():
        return np.zeros(vectors.shape[:-1])
    return (vectors[..., usable] / capacity[usable]).max(axis=-1)
