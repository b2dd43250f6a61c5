"""The undo log of ClusterState.dry_run: what one dry run changed, so leaving it restores the state."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from fairgpu.changes import Changes
from fairgpu.model.placement import Placement


class Journalled(Protocol):
    """What a journal reads and restores (ClusterState; its per-node arrays are read by name)."""

    _ledger: dict[str, Placement]
    changes: Changes


class Journal:
    """What one dry run changed, to undo it: the rows of the nodes it touched as they were before (of the
    per-node arrays named in `arrays`), and the ledger entries it added or removed."""

    def __init__(self, nodes: int, arrays: tuple[str, ...]) -> None:
        self.arrays = arrays
        self.saved = np.zeros(nodes, dtype=bool)
        self.rows: list[tuple[np.ndarray, list[np.ndarray]]] = []
        self.ledger: list[tuple[str, Placement | None]] = []  # (key, placement it had before: None = none)

    def save(self, state: Journalled, nodes: np.ndarray) -> None:
        new = np.unique(nodes[~self.saved[nodes]])
        if new.size:
            self.saved[new] = True
            self.rows.append((new, [getattr(state, name)[new].copy() for name in self.arrays]))

    def changing(self, state: Journalled, key: str, node: int, placed: Placement | None = None) -> None:
        """A placement is about to be assigned (`placed` None) or released on `node`."""
        if not self.saved[node]:
            self.save(state, np.array([node]))
        self.ledger.append((key, placed))

    def undo(self, state: Journalled) -> None:
        for key, before in reversed(self.ledger):
            if before is None:
                del state._ledger[key]
            else:
                state._ledger[key] = before
        for nodes, values in self.rows:
            for name, value in zip(self.arrays, values, strict=True):
                getattr(state, name)[nodes] = value
        if self.rows:  # the restored nodes changed again, for the caches that saw them in the dry run
            state.changes.extend(np.flatnonzero(self.saved))
