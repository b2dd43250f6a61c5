"""Pure fairness math: hierarchical weighted max-min over dominant (DRF) shares, by progressive filling.

Every leaf queue is filled along the direction of its own demand vector, so its allocation keeps its
demand's mix and its dominant share is what grows. Growth is shared top-down by weight: at each level, the
children that can still grow split their parent's rate by weight (H-DRF style). Filling stops for a leaf
when it has its demand, or when a resource it needs runs out — in the cluster, or under the guarantee or
limit of any queue on its path; the others keep filling, so nothing some queue could use stays idle.

Guarantees come first, deepest first (a queue's own guarantee before the share of its parent's guarantee
that it takes with its siblings), then everything left goes by weight up to limits and demand. Between
two events (a leaf satisfied, a resource exhausted) every rate is constant, so each step is solved exactly.
"""

from __future__ import annotations

import math
from typing import overload

import numpy as np

from fairgpu.model.queue import QueueSpec, QueueTree

_EPS = 1e-12
_TOL = 1e-9


def entitlements(tree: QueueTree, capacity: np.ndarray, leaf_demand: np.ndarray) -> np.ndarray:
    """Entitlement (Q, R) of every queue; leaf_demand is (Q, R) with zeros on inner queues.

    Leaves never get more than their demand or than any limit on their path; each queue gets at least
    min(guarantee, demand) along its mix where the guarantees fit; an inner queue is entitled to what its
    subtree is.
    """
    n = len(tree)
    capacity = np.asarray(capacity, dtype=np.float64)
    demand = np.maximum(np.asarray(leaf_demand, dtype=np.float64), 0.0)
    ent = np.zeros_like(demand)
    leaves = np.array(tree.leaves, dtype=np.int64)
    if n == 0 or not len(leaves):
        return ent
    usable = capacity > _EPS
    scale = np.where(usable, capacity, 1.0)
    norm = np.where(usable, demand[leaves] / scale, 0.0)
    impossible = ((demand[leaves] > _EPS) & ~usable).any(axis=1)  # wants a resource nobody has
    share = np.where(impossible, 0.0, norm.max(axis=1))  # dominant share of each leaf's demand
    direction = np.where(share[:, None] > _EPS, norm / np.where(share > _EPS, share, 1.0)[:, None], 0.0)
    member = np.zeros((n, len(leaves)), dtype=bool)  # member[a, j]: queue a is on leaf j's path
    for j, leaf in enumerate(leaves):
        member[tree.paths[leaf], j] = True
    filler = _Filler(tree, member, direction, share, usable)
    guaranteed = tree.guaranteed / scale
    has_guarantee = np.asarray((tree.guaranteed > 0).any(axis=1))
    depth = _depths(tree)
    for level in range(int(depth.max()), -1, -1):
        # Guarantees held at this level or deeper: their leaves fill up to every guarantee on the path.
        covered = np.asarray((member & (has_guarantee & (depth >= level))[:, None]).any(axis=0))
        caps = np.where(has_guarantee[:, None], guaranteed, np.inf)
        filler.fill(covered, np.minimum(caps, tree.limit / scale))
    filler.fill(np.ones(len(leaves), dtype=bool), tree.limit / scale)
    ent[leaves] = np.minimum(filler.x[:, None] * direction * np.where(usable, capacity, 0.0), demand[leaves])
    return tree.rollup(ent)  # an inner queue is entitled to what its subtree is


def _depths(tree: QueueTree) -> np.ndarray:
    depth = np.zeros(len(tree), dtype=np.int64)
    for i in range(len(tree)):  # parents come first
        if tree.parent[i] >= 0:
            depth[i] = depth[tree.parent[i]] + 1
    return depth


class _Filler:
    """Progressive filling state: x[j] is leaf j's dominant share (of the cluster) so far."""

    def __init__(
        self, tree: QueueTree, member: np.ndarray, direction: np.ndarray, share: np.ndarray, usable: np.ndarray
    ) -> None:
        self.tree = tree
        self.member = member
        self.direction = direction
        self.share = share
        self.usable = usable
        self.x = np.zeros(len(share))
        n = len(tree)
        self.group = np.where(tree.parent >= 0, tree.parent, n)  # siblings share a group; roots group n
        self.depth = _depths(tree)

    def fill(self, allowed: np.ndarray, caps: np.ndarray) -> None:
        """Grow the allowed leaves until each is frozen. caps: (Q, R) per-queue bound, normalised."""
        x, d, member = self.x, self.direction, self.member
        frozen = ~allowed | (self.share <= _EPS) | (x >= self.share - _TOL)
        for _ in range(len(x) + 1):
            active = ~frozen
            if not active.any():
                return
            rate = self._rates(active)
            growth = rate[:, None] * d  # (L, R) per leaf
            used = x[:, None] * d
            node_used, node_growth = member @ used, member @ growth  # (Q, R)
            total_used, total_growth = used.sum(axis=0), growth.sum(axis=0)
            with np.errstate(divide="ignore", invalid="ignore"):
                t_leaf = np.where(active & (rate > 0), (self.share - x) / rate, np.inf)
                t_node = np.where(node_growth > _EPS, (caps - node_used) / node_growth, np.inf)
                room = np.where(self.usable, 1.0, 0.0)
                t_total = np.where(total_growth > _EPS, (room - total_used) / total_growth, np.inf)
            dt = max(0.0, float(min(t_leaf.min(), t_node.min(), t_total.min())))
            if not np.isfinite(dt):  # nothing bounds the active leaves (cannot happen with finite demand)
                x[active] = self.share[active]
                return
            x[active] += rate[active] * dt
            used = x[:, None] * d
            finite = np.isfinite(caps)
            slack = np.where(finite, caps - _TOL * np.maximum(np.where(finite, caps, 1.0), 1.0), np.inf)
            node_full = (member @ used) >= slack  # (Q, R)
            total_full = used.sum(axis=0) >= 1.0 - _TOL
            blocked_dims = (member.T.astype(np.float64) @ node_full.astype(np.float64)) > 0  # (L, R)
            blocked_dims |= total_full[None, :]
            frozen |= (x >= self.share - _TOL) | ((d > _EPS) & blocked_dims).any(axis=1)

    def _rates(self, active: np.ndarray) -> np.ndarray:
        """Each active leaf's growth rate, such that at every level the children that can still grow
        raise their parent's dominant share in proportion to their weights (H-DRF): bottom-up, each
        queue's growth direction (per unit of its dominant share); top-down, its rate."""
        tree, n = self.tree, len(self.tree)
        live = (self.member & active[None, :]).any(axis=1)
        w = tree.weight * live
        denom = np.bincount(self.group, weights=w, minlength=n + 1)
        frac = np.divide(w, denom[self.group], out=np.zeros(n), where=denom[self.group] > 0)
        leaves = np.asarray(tree.leaves, dtype=np.int64)
        grow = np.zeros((n, self.direction.shape[1]))
        grow[leaves] = np.where(active[:, None], self.direction, 0.0)
        peak = np.ones(n)  # dominant component of each inner queue's weighted child growth
        for level in range(int(self.depth.max()), 0, -1):
            kids = np.flatnonzero((self.depth == level) & live)
            parents = tree.parent[kids]
            summed = np.zeros_like(grow)
            np.add.at(summed, parents, frac[kids, None] * grow[kids])
            inner = np.unique(parents)
            peak[inner] = summed[inner].max(axis=1)
            grow[inner] = summed[inner] / np.where(peak[inner] > _EPS, peak[inner], 1.0)[:, None]
        rate = np.where(tree.parent < 0, frac, 0.0)
        for level in range(1, int(self.depth.max()) + 1):
            kids = np.flatnonzero(self.depth == level)
            parents = tree.parent[kids]
            rate[kids] = rate[parents] * frac[kids] / np.where(peak[parents] > _EPS, peak[parents], 1.0)
        return np.where(active, rate[leaves], 0.0)


def water_fill(
    capacity: np.ndarray,
    demand: np.ndarray,
    weight: np.ndarray,
    guaranteed: np.ndarray,
    limit: np.ndarray,
) -> np.ndarray:
    """Entitlements of Q sibling queues sharing `capacity` (R,): one level of `entitlements`."""
    q = len(demand)
    if q == 0:
        return np.zeros((0, len(capacity)))
    tree = QueueTree(
        [
            QueueSpec(f"q{i}", float(weight[i]), np.asarray(guaranteed[i], float), np.asarray(limit[i], float))
            for i in range(q)
        ]
    )
    return entitlements(tree, capacity, np.asarray(demand, dtype=np.float64).reshape(q, -1))


@overload
def share_ratio(held: float, entitled: float) -> float: ...
@overload
def share_ratio(held: np.ndarray, entitled: np.ndarray) -> np.ndarray: ...
def share_ratio(held: np.ndarray | float, entitled: np.ndarray | float) -> np.ndarray | float:
    """A queue's share ratio: the dominant share it holds over the dominant share it is entitled to (per
    queue, for arrays); inf where a queue is entitled to nothing (any holding is then infinitely above its
    share). The one definition behind fair ordering, victim order and the no-ping-pong rule."""
    if isinstance(entitled, float):  # one queue (numpy's float64 is a float): on the placement path
        return float(held) / entitled if entitled > 0 else math.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio: np.ndarray = np.where(entitled > 0, np.asarray(held, dtype=np.float64) / entitled, np.inf)
    return ratio


def dominant_shares(vectors: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """max over dimensions of vector / capacity (dimensions with no capacity are ignored)."""
    usable = capacity > _EPS
    if not usable.any():
        return np.zeros(vectors.shape[:-1])
    shares: np.ndarray = (vectors[..., usable] / capacity[usable]).max(axis=-1)
    return shares
