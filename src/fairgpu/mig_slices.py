"""Which MIG slices each card's instances hold: ClusterState's MIG bookkeeping, kept beside the arrays it
reads (a mixin, so ClusterState's methods and callers stay as they were)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from fairgpu.errors import StateError
from fairgpu.model.placement import MIG_WHOLE, Footprint, Placement


class MigSlices:
    """MIG slice bookkeeping over ClusterState's arrays: `mig_busy` holds a bit per slice in use on each card,
    `mig_mask`/`mig_mem`/`mig_cores` each card's candidates (model/mig.py's MigTable)."""

    gpu_mig: np.ndarray
    mig_mem: np.ndarray
    mig_cores: np.ndarray
    mig_mask: np.ndarray
    mig_busy: np.ndarray
    _ledger: dict[str, Placement]

    def mig_slices(self, node: int, slot: int, c: int) -> int:
        """The slice bitmask MIG candidate `c` takes on a card (MIG_WHOLE: all of them)."""
        return -1 if c == MIG_WHOLE else int(self.mig_mask[node, slot, c])

    def _mig_for(self, node: int, slot: int, need: int, busy: dict[int, int]) -> int:
        """The MIG candidate for `need` MiB on a card (-1 when it is not a MIG card or none is free)."""
        if not self.gpu_mig[node, slot]:
            return -1
        taken = int(self.mig_busy[node, slot]) | busy.get(slot, 0)
        mem, mask = self.mig_mem[node, slot], self.mig_mask[node, slot]
        ok = (mem >= need) & ((mask & taken) == 0) & (mem >= 0)
        return int(ok.argmax()) if ok.any() else -1

    def _mig_held(self, node: int, slot: int) -> int:
        held = 0
        for q in self._ledger.values():
            if q.node == node and q.mig:
                for s, c in zip(q.slots, q.mig, strict=True):
                    if s == slot and c != -1:
                        held |= self.mig_slices(node, slot, c)
        return held

    def _mig_entry_fits(self, i: int, s: int, cores: int, mem: int, c: int, slices: dict[int, int]) -> bool:
        """A MIG card's entry must name one of its candidates, book exactly that profile, and take slices
        nobody holds; an ordinary card takes no MIG candidate, and a MIG card nothing without one."""
        if not (0 <= s < self.mig_busy.shape[1]):  # one column per GPU slot
            return False
        if not self.gpu_mig[i, s]:
            return c < 0
        taken = slices.get(s, int(self.mig_busy[i, s]))
        if c == MIG_WHOLE:  # whatever slices are left: it blocks the card, it never overlaps a real instance
            slices[s] = -1
            return True
        if not (0 <= c < self.mig_mem.shape[2]) or self.mig_mem[i, s, c] < 0:
            return False
        if (cores, mem) != (self.mig_cores[i, s, c], self.mig_mem[i, s, c]):
            return False
        mask = int(self.mig_mask[i, s, c])
        slices[s] = taken | mask
        return taken & mask == 0

    def _apply_mig(self, p: Placement, sign: int) -> None:
        """Book (sign < 0) or give back a placement's MIG instances on its node."""
        i = p.node
        for slot, c in zip(p.slots, p.mig, strict=False):
            if c != -1 and sign < 0:
                self.mig_busy[i, slot] |= self.mig_slices(i, slot, c)
            elif c != -1:  # the slices the rest of the ledger still holds (a MIG_WHOLE entry overlaps others)
                self.mig_busy[i, slot] = self._mig_held(i, slot)

    def _free_mig(self, fp: Footprint) -> None:
        """Give the footprint's MIG instances back: real instances never share a slice, so their bits clear;
        a card that holds or frees a MIG_WHOLE entry (every slice) is recomputed from what the ledger keeps."""
        mig = fp.slot_mig != -1
        n, s, c = fp.slot_node[mig], fp.slot_idx[mig], fp.slot_mig[mig]
        real = c >= 0
        bits = np.zeros(len(c), dtype=np.int64)
        bits[real] = self.mig_mask[n[real], s[real], c[real]]
        odd = {(int(a), int(b)) for a, b in zip(n, s, strict=True) if self.mig_busy[a, b] == -1}
        freed = np.zeros_like(self.mig_busy)
        np.bitwise_or.at(freed, (n, s), bits)
        self.mig_busy &= ~freed
        if not odd:
            return
        gone = Counter(zip(n.tolist(), s.tolist(), c.tolist(), strict=True))
        held = dict.fromkeys(odd, 0)
        for q in self._ledger.values():
            for slot, cand in zip(q.slots, q.mig, strict=False):
                if (q.node, slot) in held and cand != -1:
                    if gone[(q.node, slot, cand)] > 0:
                        gone[(q.node, slot, cand)] -= 1
                    else:
                        held[(q.node, slot)] |= self.mig_slices(q.node, slot, cand)
        for (a, b), h in held.items():
            self.mig_busy[a, b] = h

    def _check_mig(self) -> None:
        """Raise StateError if two instances share a slice or `mig_busy` disagrees with the ledger."""
        busy = np.zeros_like(self.mig_busy)
        for p in self._ledger.values():
            for s, c in zip(p.slots, p.mig, strict=False):
                if c != -1:
                    if c != MIG_WHOLE and busy[p.node, s] & self.mig_slices(p.node, s, c) and busy[p.node, s] != -1:
                        raise StateError("two MIG instances share a slice")
                    busy[p.node, s] |= self.mig_slices(p.node, s, c)
        if not np.array_equal(busy, self.mig_busy):
            raise StateError("MIG slices in use disagree with the placements held")
