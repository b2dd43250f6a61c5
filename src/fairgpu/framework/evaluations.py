"""Filter and score results per pod shape, kept current node by node.

Every node is filtered and scored for every pod, but a node's verdict and score depend only on the pod and
that node's state (and, for a score, on its plugin's generation: learned weights, say). So the results of
a pod shape are kept per cluster state, and a pod of that shape recomputes them only for the nodes that
`ClusterState.changes` lists since, or for all of them when a score plugin's generation changed: after one
placement, one node. What it reads is what a fresh evaluation of every node would give, bit for
bit (tests/test_evaluations.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fairgpu.changes import EVERY
from fairgpu.framework.interfaces import EngineView, Filter, FitMask, Profile
from fairgpu.model.pod import PodSpec

SHAPES = 256  # shapes kept per state, the least recently used dropped first
_REFUSED = np.float64(-np.inf)  # the total of a node the filters refuse


@dataclass(slots=True)
class Shape:
    """One pod shape's results on every node of one state."""

    nodes: np.ndarray  # (N,) bool: the filters let the node take the pod
    slots: np.ndarray | None  # (N, G) bool: GPU slots that can take it (GPU pods)
    total: np.ndarray  # (N,) weighted sum of the scores, -inf where the filters refuse the node
    filtered_at: int  # the state's version when the verdicts were last brought up to date
    scored_at: int = EVERY  # and the scores
    generation: tuple[int, ...] = ()
    # the filters' answer on the rows they last brought up to date (rows: `Changes.since`'s own array, the
    # same object for the same mark until the next change): scoring those very rows reads it, not a copy of
    # the same verdicts out of `nodes` and `slots`
    fresh: FitMask | None = None
    filters: tuple[Filter, ...] = ()  # the profile's filters that may refuse the pod a node of this state
    # the only such filter's pass that writes the verdicts of changed rows into `nodes` and `slots` itself
    into: Callable[[PodSpec, EngineView, np.ndarray | slice, np.ndarray, np.ndarray | None], FitMask | None] | None = (
        None
    )


def run_filters(pod: PodSpec, view: EngineView, profile: Profile, rows: np.ndarray | slice) -> FitMask:
    """The profile's filters on these rows, in order."""
    return _run(pod, view, profile.filter, rows)


def _run(pod: PodSpec, view: EngineView, filters: Sequence[Filter], rows: np.ndarray | slice) -> FitMask:
    nodes = np.empty(view.state.num_nodes if isinstance(rows, slice) else len(rows), dtype=bool)
    nodes.fill(True)  # np.ones costs a microsecond more, asked for on every placement
    mask = FitMask(nodes=nodes, rows=rows)
    for f in filters:
        f.filter(pod, view, mask)
    return mask


def _refuses(f: Filter, pod: PodSpec, view: EngineView) -> bool:
    """Whether filter `f` may refuse the pod a node of this state (Filter's optional `indifferent`)."""
    indifferent = getattr(f, "indifferent", None)
    return indifferent is None or not indifferent(pod, view)


def filtered(pod: PodSpec, view: EngineView, profile: Profile) -> Shape:
    """The pod's shape with its filter verdicts current on every node."""
    st = view.state
    shapes: OrderedDict[tuple[Any, ...], Shape] | None = profile.evaluations.get(st)
    if shapes is None:
        shapes = profile.evaluations[st] = OrderedDict()
    key = pod.key()
    shape = shapes.get(key)
    if shape is None:
        # a filter indifferent to the pod on this state stays so while the state lives, as the shape does
        filters = tuple([f for f in profile.filter if _refuses(f, pod, view)])
        into = getattr(filters[0], "filter_into", None) if len(filters) == 1 else None
        nodes = np.empty(st.num_nodes, dtype=bool)
        slots = None if pod.gpu is None else np.empty(st.gpu_valid.shape, dtype=bool)
        if into is None or into(pod, view, slice(None), nodes, slots) is None:
            mask = _run(pod, view, filters, slice(None))
            nodes = np.array(mask.nodes)
            slots = None if mask.slots is None else np.array(mask.slots)  # may be the state's own array
        shape = Shape(nodes, slots, np.zeros(st.num_nodes), st.version, filters=filters, into=into)
        shapes[key] = shape
        if len(shapes) > SHAPES:
            shapes.popitem(last=False)
        return shape
    shapes.move_to_end(key)
    if shape.filtered_at == st.version:
        return shape
    rows = st.changes.since(shape.filtered_at)
    shape.filtered_at = st.version
    into = shape.into
    written = None if into is None else into(pod, view, rows, shape.nodes, shape.slots)
    if written is None:
        written = _run(pod, view, shape.filters, rows)
        shape.nodes[rows] = written.nodes
        if shape.slots is not None and written.slots is not None:
            shape.slots[rows] = written.slots
    shape.fresh = written
    return shape


def scored(shape: Shape, pod: PodSpec, view: EngineView, profile: Profile) -> np.ndarray:
    """(N,) the weighted score sum, current on every node (for a pod some node can take), -inf on nodes the
    filters refuse: its argmax is the best feasible node, in one pass."""
    st = view.state
    generation = tuple([plugin.generation(pod, view) for plugin, _ in profile.score])
    rows: np.ndarray | slice
    if generation != shape.generation:
        rows, shape.generation = slice(None), generation
    elif shape.scored_at == st.version:
        return shape.total
    else:
        rows = st.changes.since(shape.scored_at)
    shape.scored_at = st.version
    fresh = shape.fresh
    if fresh is not None and fresh.rows is rows:  # filtered just now, these very rows
        mask = fresh
    else:
        mask = FitMask(shape.nodes[rows], None if shape.slots is None else shape.slots[rows], rows=rows)
    # The weighted sum 0 + w1·s1 + w2·s2 + ... in float64, in that order, without the array operations that
    # change no value: the leading 0 (0 + x is x, but for -0.0, which no argmax tells from 0.0), a weight of 1,
    # and a plugin indifferent to the pod (its scores all 0). Arrays are read, never written: a plugin may keep
    # the one it returned.
    total: np.ndarray | None = None
    for plugin, weight in profile.score:
        indifferent = getattr(plugin, "indifferent", None)
        if indifferent is not None and indifferent(pod):
            continue
        if total is not None and total.dtype == np.float64:
            add = getattr(plugin, "add_weighted", None)
            if add is not None:  # the product and the sum in one step (Score's optional method)
                total = add(pod, view, mask, weight, total)
                continue
        scores = plugin.score(pod, view, mask)
        weighted = scores if weight == 1.0 else weight * scores
        total = weighted if total is None else np.add(total, weighted, dtype=np.float64)
    if total is None:
        total = np.zeros(len(mask.nodes))
    # -inf as a float64 scalar: the result is float64 whatever the plugins' dtype (a Python float would not say)
    if isinstance(rows, slice):  # every node: the new array is the shape's (callers read it at once)
        shape.total = np.where(mask.nodes, total, _REFUSED)
    else:
        shape.total[rows] = np.where(mask.nodes, total, _REFUSED)
    return shape.total
