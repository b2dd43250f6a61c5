"""Filter plugin: kube-scheduler's NodeAffinity and TaintToleration for the nodes a pod may use — its node
selector, its required node affinity (matchExpressions In/NotIn/Exists/DoesNotExist/Gt/Lt) and the
NoSchedule/NoExecute taints it does not tolerate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fairgpu.framework.interfaces import EngineView, FitMask
from fairgpu.model.constraints import BLOCKING_EFFECTS, MatchExpression
from fairgpu.model.pod import PodSpec
from fairgpu.state import ClusterState

_CACHE_LIMIT = 256
_ANY_TAINTED = ("any tainted", None)


@dataclass(slots=True)
class NodeAffinity:
    NAME: ClassVar[str] = "NodeAffinity"
    # Node labels and taints never change under a ClusterState and constrained pod shapes repeat, so
    # each distinct constraint is evaluated once per state (one pass over the nodes), then reused.
    # Keyed by the node list, which copies of a state share; the list is kept in the entry so its id
    # cannot be reused by another list while the entry lives.
    _cache: dict[tuple[Any, ...], tuple[list[Any], np.ndarray]] = field(default_factory=dict)

    def indifferent(self, pod: PodSpec, view: EngineView) -> bool:
        """Nothing to match and no taint to tolerate (the usual pod): every node passes."""
        return not (pod.node_selector or pod.affinity or self._cached(view.state, _ANY_TAINTED, _any_tainted))

    def filter(self, pod: PodSpec, view: EngineView, mask: FitMask) -> None:
        if self.indifferent(pod, view):
            return
        for _, excluded in self.reasons(pod, view):
            mask.restrict_nodes(~excluded[mask.rows])

    def reasons(self, pod: PodSpec, view: EngineView) -> list[tuple[str, np.ndarray]]:
        st = view.state
        out = []
        if pod.node_selector:
            out.append(("node selector does not match", ~self._cached(st, ("sel", pod.node_selector), _selector)))
        if pod.affinity:
            out.append(("node affinity does not match", ~self._cached(st, ("aff", pod.affinity), _affinity)))
        if self._cached(st, _ANY_TAINTED, _any_tainted):
            out.append(("untolerated taint", self._cached(st, ("tol", pod.tolerations), _untolerated)))
        return out

    def _cached(
        self, state: ClusterState, key: tuple[Any, ...], compute: Callable[[ClusterState, Any], np.ndarray]
    ) -> np.ndarray:
        full = (id(state.nodes), *key)
        hit = self._cache.get(full)
        if hit is None:  # a hit's list is state.nodes: the entry keeps it alive, so its id is not reused
            if len(self._cache) > _CACHE_LIMIT:
                self._cache.clear()
            hit = self._cache[full] = (state.nodes, compute(state, key[1]))
        return hit[1]


def _selector(state: ClusterState, selector: tuple[tuple[str, str], ...]) -> np.ndarray:
    return np.array([all(nd.labels.get(k) == v for k, v in selector) for nd in state.nodes], dtype=bool)


def _affinity(state: ClusterState, terms: tuple[tuple[MatchExpression, ...], ...]) -> np.ndarray:
    return np.array([any(all(e.matches(nd.labels) for e in term) for term in terms) for nd in state.nodes], dtype=bool)


def _tainted(state: ClusterState, _: object) -> np.ndarray:
    return np.array([any(t.effect in BLOCKING_EFFECTS for t in nd.taints) for nd in state.nodes], dtype=bool)


def _any_tainted(state: ClusterState, _: object) -> np.ndarray:
    return np.asarray(_tainted(state, None).any())  # asked for every pod: one bool per state


def _untolerated(state: ClusterState, tolerations: tuple[Any, ...]) -> np.ndarray:
    return np.array(
        [
            any(t.effect in BLOCKING_EFFECTS and not any(tol.tolerates(t) for tol in tolerations) for t in nd.taints)
            for nd in state.nodes
        ],
        dtype=bool,
    )
