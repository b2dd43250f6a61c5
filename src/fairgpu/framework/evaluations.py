"""Filter and score results per pod shape, kept current node by node.

Every node is filtered and scored for every pod, but a node's verdict and score depend only on the pod and
that node's state (and, for a score, on its plugin's generation: learned weights, say). So the results of
a pod shape are kept per cluster state, and a pod of that shape recomputes them only for the nodes that
`ClusterState.changes` lists since, or for all of them when a score plugin's generation changed: after one
placement, one node. What it reads is what a fresh evaluation of every node would give, bit for
bit (tests/test_evaluations.py).

A shape whose scores are stale on every node (new to the cache, or the generation moved) takes them from
a shape the score plugins cannot tell apart from it (equal `score_key`s: say, shared pods that differ only
in GPU memory, which the filters alone read) scored under the same generation, and recomputes only the
nodes where the two shapes' filter verdicts differ: the learned weights move about every hundred
placements, and a pod shape comes back about every thousand, so most of those are otherwise every node.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairgpu.changes import EVERY
from fairgpu.framework.interfaces import EngineView, FitMask, Profile
from fairgpu.model.pod import PodSpec

SHAPES = 256  # shapes kept per state, the least recently used dropped first


@dataclass(slots=True)
class Shape:
    """One pod shape's results on every node of one state."""

    pod: PodSpec
    key: tuple[Any, ...]  # pod.key()
    shares: Hashable  # the score plugins' score keys (None: some plugin has none, nothing is shared)
    nodes: np.ndarray  # (N,) bool: the filters let the node take the pod
    slots: np.ndarray | None  # (N, G) bool: GPU slots that can take it (GPU pods)
    total: np.ndarray  # (N,) weighted sum of the scores, -inf where the filters refuse the node
    filtered_at: int  # the state's version when the verdicts were last brought up to date
    scored_at: int = EVERY  # and the scores
    generation: tuple[int, ...] = ()


@dataclass(slots=True)
class Shapes:
    """One state's shapes, least recently used first, and by score key the shape scored last."""

    by_key: OrderedDict[tuple[Any, ...], Shape]
    latest: dict[Hashable, Shape]


def score_key(pod: PodSpec, profile: Profile) -> Hashable:
    """What the profile's scores read of the pod beside the filters' verdicts; None if a plugin does not say."""
    keys = []
    for plugin, _ in profile.score:
        key = getattr(plugin, "score_key", None)  # a SharesScores plugin, found by its method (see _teach)
        if key is None:
            return None
        keys.append(key(pod))
    return tuple(keys)


def run_filters(pod: PodSpec, view: EngineView, profile: Profile, rows: np.ndarray | slice) -> FitMask:
    """The profile's filters on these rows, in order."""
    n = view.state.num_nodes if isinstance(rows, slice) else len(rows)
    mask = FitMask(nodes=np.ones(n, dtype=bool), rows=rows)
    for f in profile.filter:
        f.filter(pod, view, mask)
    return mask


def filtered(pod: PodSpec, view: EngineView, profile: Profile) -> Shape:
    """The pod's shape with its filter verdicts current on every node."""
    st = view.state
    cache: Shapes | None = profile.evaluations.get(st)
    if cache is None:
        cache = profile.evaluations[st] = Shapes(OrderedDict(), {})
    shapes, key = cache.by_key, pod.key()
    shape = shapes.get(key)
    if shape is None:
        mask = run_filters(pod, view, profile, slice(None))
        slots = None if mask.slots is None else np.array(mask.slots)  # may be the state's own array
        nodes, total = np.array(mask.nodes), np.zeros(st.num_nodes)
        shape = shapes[key] = Shape(pod, key, score_key(pod, profile), nodes, slots, total, st.version)
        if len(shapes) > SHAPES:
            _, old = shapes.popitem(last=False)
            if cache.latest.get(old.shares) is old:
                del cache.latest[old.shares]
        return shape
    shapes.move_to_end(key)
    if shape.filtered_at == st.version:
        return shape
    rows = st.changes.since(shape.filtered_at)
    shape.filtered_at = st.version
    mask = run_filters(pod, view, profile, rows)
    shape.nodes[rows] = mask.nodes
    if shape.slots is not None and mask.slots is not None:
        shape.slots[rows] = mask.slots
    return shape


def scored(shape: Shape, pod: PodSpec, view: EngineView, profile: Profile) -> np.ndarray:
    """(N,) the weighted score sum, current on every node (for a pod some node can take), -inf on nodes the
    filters refuse: its argmax is the best feasible node, in one pass."""
    st = view.state
    generation = tuple(plugin.generation(pod, view) for plugin, _ in profile.score)
    rows: np.ndarray | slice
    if generation != shape.generation:
        shape.generation = generation
        rows = _unlike(shape, view, profile)
    elif shape.scored_at == st.version:
        return shape.total
    else:
        rows = st.changes.since(shape.scored_at)
    shape.scored_at = st.version
    if isinstance(rows, slice) or rows.size:
        mask = FitMask(shape.nodes[rows], None if shape.slots is None else shape.slots[rows], rows=rows)
        total = np.zeros(len(mask.nodes))
        for plugin, weight in profile.score:
            total += weight * plugin.score(pod, view, mask)
        shape.total[rows] = np.where(mask.nodes, total, -np.inf)
    if shape.shares is not None:
        profile.evaluations[st].latest[shape.shares] = shape
    return shape.total


def _unlike(shape: Shape, view: EngineView, profile: Profile) -> np.ndarray | slice:
    """The rows a shape whose scores went stale everywhere must score itself, taking the totals of the last
    shape scored with its score key under its generation for the rest: the nodes changed since that one was
    scored, and those where the two shapes' filter verdicts differ (on unchanged nodes its verdicts are still
    those it was scored with). Every row if there is no such shape, or most rows would be rescored anyway."""
    other = None if shape.shares is None else profile.evaluations[view.state].latest.get(shape.shares)
    if other is None or other is shape or other.generation != shape.generation:
        return slice(None)
    if (other.slots is None) != (shape.slots is None):
        return slice(None)
    changed = view.state.changes.since(other.scored_at)
    if len(changed) > len(shape.total) // 4:  # fancy-indexed rows cost more per node than every node
        return slice(None)
    differ = [changed, np.flatnonzero(shape.nodes != other.nodes)]
    if shape.slots is not None and other.slots is not None:  # few differ: (N, G).any(axis=1) costs ~50 times more
        differ.append(np.flatnonzero(shape.slots != other.slots) // shape.slots.shape[1])
    np.copyto(shape.total, other.total)
    return np.unique(np.concatenate(differ))
