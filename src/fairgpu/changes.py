"""Which nodes of a ClusterState changed since a mark: the log that lets caches keyed by the state (filter
and score results per pod shape, a score plugin's per-node sums) bring only those nodes up to date.

A cache remembers `end` when it is current; later `since(mark)` lists the nodes changed after it. Finding
them costs the changes made since, not a pass over every node: after one placement, one node.
"""

from __future__ import annotations

import numpy as np

EVERY = -1  # a mark older than anything the log keeps: since() answers every node
# up to this many entries are deduplicated through a set; more, through a mark per node (a pass over the
# nodes' marks costs ~1.5 µs at 5,000 nodes, a set of k entries ~0.07k µs: 64 entries took 4.3 µs)
_FEW = 16


class Changes:
    def __init__(self, nodes: int, start: int = 0) -> None:
        self.nodes = nodes
        # The log keeps at least this many recent entries; a cache further behind recomputes every node,
        # which costs no more than the many nodes it would otherwise list.
        self._keep = max(4 * nodes, 1024)
        self._log = np.zeros(2 * self._keep, dtype=np.int64)  # node indices, oldest first
        self._n = 0  # entries in _log; _log[0] is at position _base
        self._base = start
        # The position after the last change (_base + _n, kept as it moves: every pod's evaluation reads it a
        # few times): a mark that `since` answers with nothing until a node changes.
        self.end = start
        # since()'s answers at one end, by mark: the filters, the scores and a score plugin's sums of one pod
        # ask for the same marks in turn (a shape's filters and scores are usually as old as each other)
        self._answers: dict[int, np.ndarray] = {}
        self._answered_at = start

    def add(self, node: int) -> None:
        if self._n == len(self._log):
            self._forget(self._n - self._keep)
        self._log[self._n] = node
        self._n += 1
        self.end += 1

    def extend(self, nodes: np.ndarray) -> None:
        k = len(nodes)
        if k > self._keep:  # more than the log keeps: older marks must recompute every node anyway
            self._base = self.end = self.end + k
            self._n = 0
            return
        if self._n + k > len(self._log):
            self._forget(self._n - self._keep)
        self._log[self._n : self._n + k] = nodes
        self._n += k
        self.end += k

    def _forget(self, drop: int) -> None:
        self._log[: self._n - drop] = self._log[drop : self._n]
        self._n -= drop
        self._base += drop

    def since(self, mark: int) -> np.ndarray:
        """The nodes changed after `mark` (an earlier `end`), each once, ascending; every node when the
        log no longer reaches back to it. Callers until the next change share the answer: read it, never
        write it."""
        end = self.end
        if self._answered_at != end:
            self._answers.clear()
            self._answered_at = end
        rows = self._answers.get(mark)
        if rows is None:
            rows = self._answers[mark] = self._since(mark)
        return rows

    def _since(self, mark: int) -> np.ndarray:
        if mark < self._base:
            return np.arange(self.nodes)
        changed = self._log[mark - self._base : self._n]
        if len(changed) <= 1:
            return changed.copy()
        if len(changed) <= _FEW:
            return np.array(sorted(set(changed.tolist())), dtype=np.int64)
        seen = np.zeros(self.nodes, dtype=bool)
        seen[changed] = True
        return seen.nonzero()[0]  # np.flatnonzero's wrapper costs half a microsecond more

    def fork(self) -> Changes:
        """An empty log for a copy of the state, continuing from this one's end (a mark taken on one state
        means nothing on the other; caches are kept per state)."""
        return Changes(self.nodes, self.end)
