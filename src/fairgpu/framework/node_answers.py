"""Every node's answer to one question, kept per cluster state and brought up to date only on the nodes changed
since (`ClusterState.changes`). For answers that depend on the node alone and are asked for every node again and
again: a pod shape new to the engine's cache, or another plugin's new generation, re-asks every node."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from weakref import WeakKeyDictionary

import numpy as np

from fairgpu.state import ClusterState


class NodeAnswers:
    def __init__(self, most: int = 1) -> None:
        # per state (gone with it): key -> (the state's version when last brought up to date, every node's answer)
        self._kept: WeakKeyDictionary[ClusterState, dict[Hashable, tuple[int, np.ndarray]]] = WeakKeyDictionary()
        self._most = most  # keys kept per state; past it they are all dropped

    def every(self, st: ClusterState, key: Hashable, answer: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Every node's answer for `key`, `answer(rows)` giving the rows' (node indices, ascending). The array is
        the cache's own: read it, never write it."""
        kept = self._kept.get(st)
        if kept is None:
            kept = self._kept[st] = {}
        hit = kept.get(key)
        if hit is None:
            if len(kept) >= self._most:
                kept.clear()
            out = np.asarray(answer(np.arange(st.num_nodes)))
        else:
            at, out = hit
            rows = st.changes.since(at)
            if rows.size:
                out[rows] = answer(rows)
        kept[key] = (st.version, out)
        return out
