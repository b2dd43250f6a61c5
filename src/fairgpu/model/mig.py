"""MIG as HAMi v2.10 schedules it (pkg/device/nvidia/device.go `CustomFilterRule`, `selectMigCandidate`,
mig_topology.go): the profiles a card registered, the order HAMi tries (profile, placement) candidates in,
and a table of every MIG card's candidates as arrays, so a request's instance is picked on many cards at once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIG_MODE = "mig"


@dataclass(slots=True, frozen=True)
class MigTemplate:
    """One MIG profile a card offers (HAMi's `migProfiles` in its register annotation): the instance's memory
    and cores, and the slice ranges (start, size) it may occupy."""

    name: str
    memory_mib: int
    cores: int
    slices: int
    placements: tuple[tuple[int, int], ...] = ()


def mig_candidates(profiles: tuple[MigTemplate, ...]) -> list[tuple[int, int, int]]:
    """(profile index, start, size) in the order HAMi's `selectMigCandidate` tries them: profiles by memory,
    then slice count (stable); each profile's placements highest start first for 1g./3g. profiles, lowest
    first otherwise (`orderedMigPlacements`). A request takes the first with enough memory and free slices."""
    order = sorted(range(len(profiles)), key=lambda k: (profiles[k].memory_mib, profiles[k].slices))
    out = []
    for k in order:
        high = profiles[k].name.startswith(("1g.", "3g."))
        for start, size in sorted(profiles[k].placements, key=lambda ps: -ps[0] if high else ps[0]):
            out.append((k, start, size))
    return out


@dataclass(slots=True, frozen=True)
class MigTable:
    """Per card (nodes × cards × candidates, in HAMi's order): the candidate's MiB (-1: none), cores and slice
    bitmask; `cards` marks MIG cards with profiles. Static: capacity never changes."""

    any: bool
    cards: np.ndarray
    mem: np.ndarray
    cores: np.ndarray
    mask: np.ndarray

    @classmethod
    def of(cls, nodes: Sequence[Sequence[tuple[str, tuple[MigTemplate, ...]]]], g: int) -> MigTable:
        """From each node's cards as (mode, MIG profiles)."""
        cands = {(i, j): mig_candidates(mig) for i, nd in enumerate(nodes) for j, (mode, mig) in enumerate(nd)
                 if mode == MIG_MODE and mig}  # fmt: skip
        n, c = len(nodes), max((len(v) for v in cands.values()), default=0)
        t = cls(bool(cands), np.zeros((n, g), dtype=bool), np.full((n, g, c), -1, dtype=np.int64),
                np.zeros((n, g, c), dtype=np.int64), np.zeros((n, g, c), dtype=np.int64))  # fmt: skip
        for (i, j), cs in cands.items():
            t.cards[i, j] = True
            profiles = nodes[i][j][1]
            for k, (pk, start, size) in enumerate(cs):
                t.mem[i, j, k], t.cores[i, j, k] = profiles[pk].memory_mib, profiles[pk].cores
                t.mask[i, j, k] = ((1 << size) - 1) << start
        return t

    def fields(self) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.any, self.cards, self.mem, self.cores, self.mask

    def pick(self, rows: np.ndarray | slice, need: int | np.ndarray, busy: np.ndarray) -> np.ndarray:
        """(rows, G): the candidate HAMi's `selectMigCandidate` takes for `need` MiB on each card with `busy`
        slices in use: the first with that much memory on free slices; -1 where none (or not a MIG card)."""
        return self._first(self.mem[rows], self.mask[rows], need, busy)

    def pick_cards(self, nodes: np.ndarray, slots: np.ndarray, need: np.ndarray, busy: np.ndarray) -> np.ndarray:
        """pick for single cards: (nodes[k], slots[k]) with need[k] MiB and busy[k] slices in use."""
        return self._first(self.mem[nodes, slots], self.mask[nodes, slots], need, busy)

    def _first(self, mem: np.ndarray, mask: np.ndarray, need: int | np.ndarray, busy: np.ndarray) -> np.ndarray:
        if not self.any:
            return np.full(busy.shape, -1)
        need = np.broadcast_to(need, busy.shape)
        ok = (mem >= need[..., None]) & ((mask & busy[..., None]) == 0) & (mem >= 0)
        return np.where(ok.any(axis=-1), ok.argmax(axis=-1), -1)
