"""Which nodes of a ClusterState changed since a mark: the log that lets caches keyed by the state (filter
and score results per pod shape, a score plugin's per-node sums) bring only those nodes up to date.

A cache remembers `end` when it is current; later `since(mark)` lists the nodes changed after it. Finding
them costs the changes made since, not a pass over every node: after one placement, one node.
"""

from __future__ import annotations

import numpy as np

EVERY = -1  # a mark older than anything the log keeps: since() answers every node


class Changes:
    def __init__(self, nodes: int, start: int = 0) -> None:
        self.nodes = nodes
        self._log: list[int] = []  # node indices, oldest first; _log[0] is at position _base
        self._base = start
        # The log keeps at least this many recent entries; a cache further behind recomputes every node,
        # which costs no more than the many nodes it would otherwise list.
        self._keep = max(4 * nodes, 1024)

    @property
    def end(self) -> int:
        """The position after the last change: a mark that `since` answers with nothing until a node changes."""
        return self._base + len(self._log)

    def add(self, node: int) -> None:
        self._log.append(node)
        if len(self._log) > 2 * self._keep:
            drop = len(self._log) - self._keep
            del self._log[:drop]
            self._base += drop

    def extend(self, nodes: np.ndarray) -> None:
        for node in nodes.tolist():
            self.add(node)

    def since(self, mark: int) -> np.ndarray:
        """The nodes changed after `mark` (an earlier `end`), each once, ascending; every node when the
        log no longer reaches back to it."""
        if mark < self._base:
            return np.arange(self.nodes)
        changed = self._log[mark - self._base :]
        if len(changed) <= 1:
            return np.array(changed, dtype=np.int64)
        return np.unique(np.array(changed, dtype=np.int64))

    def fork(self) -> Changes:
        """An empty log for a copy of the state, continuing from this one's end (a mark taken on one state
        means nothing on the other; caches are kept per state)."""
        return Changes(self.nodes, self.end)
