"""Share accounting: what each queue holds, wants and is entitled to, and its decayed past usage — the
numbers fair ordering and preemption decide by. The arrays live in the EngineView that plugins read."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from fairgpu import fairness
from fairgpu import resources as r
from fairgpu.framework.interfaces import EngineView
from fairgpu.model.pod import PodSpec
from fairgpu.model.queue import QueueTree
from fairgpu.state import ClusterState

_BY_ID = 1 << 14  # pod objects remembered by identity (then forgotten all at once; `_charges` stays)


class ShareAccounting:
    def __init__(self, state: ClusterState, tree: QueueTree) -> None:
        q, dims = len(tree), len(r.FAIR_DIMS)
        self.view = EngineView(
            state=state,
            tree=tree,
            capacity=state.capacity_vector(),
            usage=np.zeros((q, dims)),
            demand=np.zeros((q, dims)),
            entitled=np.zeros((q, dims)),
            usage_dom=np.zeros(q),
            entitled_dom=np.zeros(q),
            history_dom=np.zeros(q),
            share_ratio=np.zeros(q),
        )
        self._mean_mem = state.mean_gpu_memory_mib()
        self._charges: dict[PodSpec, np.ndarray] = {}
        self._by_id: dict[int, tuple[PodSpec, np.ndarray]] = {}
        # Decayed usage: integral of past usage (resource-seconds) with each queue's half-life.
        self._decay_rate = np.where(tree.half_life > 0, math.log(2) / np.maximum(tree.half_life, 1e-9), 0.0)
        self._history = np.zeros((q, dims))
        self._history_t: float | None = None

    def nominal_dom(self) -> np.ndarray:
        """(Q,) each queue's dominant share when every queue wants all it can hold (weights, guarantees,
        limits): what a queue holds beyond it, it borrows, and the others may want it back once they have work."""
        v = self.view
        everything = np.where(v.tree.is_leaf[:, None], v.capacity, 0.0)
        return fairness.dominant_shares(fairness.entitlements(v.tree, v.capacity, everything), v.capacity)

    def charge(self, pod: PodSpec) -> np.ndarray:
        """The pod's fair vector (cached per pod shape: the same spec is charged the same). Looked up by the
        object first: hashing and comparing a PodSpec's every field cost more than the lookup is worth, and
        one workload's pods are one object, charged at each admission and placement."""
        hit = self._by_id.get(id(pod))
        if hit is not None and hit[0] is pod:
            return hit[1]
        c = self._charges.get(pod)
        if c is None:
            c = self._charges[pod] = pod.charge(self._mean_mem)
        if len(self._by_id) >= _BY_ID:
            self._by_id.clear()
        self._by_id[id(pod)] = (pod, c)  # the entry holds the pod: its id cannot go to another object
        return c

    def charge_of(self, pods: Iterable[PodSpec]) -> np.ndarray:
        return sum((self.charge(p) for p in pods), r.zeros())

    def dominant(self, charge: np.ndarray) -> float:
        """A fair vector's dominant share of the cluster."""
        return float(fairness.dominant_shares(charge, self.view.capacity))

    def refresh(self, now: float) -> None:
        """Decay usage history to `now` and recompute entitlements and every queue's share ratio."""
        v = self.view
        self._decay(now)
        v.entitled = fairness.entitlements(v.tree, v.capacity, v.demand)
        v.entitled_dom = fairness.dominant_shares(v.entitled, v.capacity)
        v.usage_dom = fairness.dominant_shares(v.usage, v.capacity)
        v.history_dom = fairness.dominant_shares(self._history * self._decay_rate[:, None], v.capacity)
        v.share_ratio = fairness.share_ratio(v.usage_dom + v.history_dom, v.entitled_dom)

    def inherit(self, old: ShareAccounting, same: list[tuple[int, int]], now: float) -> None:
        """Take over `old`'s decayed usage, brought up to `now`, for each (queue here, queue there) pair."""
        old._decay(now)
        for mine, theirs in same:
            self._history[mine] = old._history[theirs]
        self._history_t = now

    def _decay(self, now: float) -> None:
        if self._history_t is not None and now > self._history_t:
            lam = self._decay_rate
            keep = np.exp(-lam * (now - self._history_t))
            # exact integral of constant usage over the interval, decayed to `now`
            gained = np.where(lam > 0, (1 - keep) / np.where(lam > 0, lam, 1.0), 0.0)
            self._history = self._history * keep[:, None] + self.view.usage * gained[:, None]
        self._history_t = now if self._history_t is None else max(self._history_t, now)
