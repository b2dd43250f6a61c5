"""Where pods run, as plain data: a Placement (one pod's node and card entries) and a Footprint (what a set of
placements holds, as arrays, for freeing it in a dry run)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True, frozen=True)
class Placement:
    """Where one pod runs: a node, and per card entry (its GPU slot, the cores and MiB it takes there).

    A pod with several GPU containers lists each container's entries in turn (`segments` says how many each
    has; empty means one container), so one card may appear once per container, as in HAMi."""

    node: int
    slots: tuple[int, ...] = ()
    cores: tuple[int, ...] = ()  # per entry, same order as slots
    mem_mib: tuple[int, ...] = ()  # per entry, same order as slots
    cpu_m: int = 0
    memory_mib: int = 0
    segments: tuple[int, ...] = ()  # entries per GPU container, in container order; () = one container
    mig: tuple[int, ...] = ()  # per entry on a MIG card, its MIG candidate (see mig_candidates), else -1

    def containers(self) -> list[range]:
        """The entry indices of each GPU container."""
        sizes = self.segments or ((len(self.slots),) if self.slots else ())
        starts = itertools.accumulate(sizes, initial=0)
        return [range(a, b) for a, b in itertools.pairwise(starts)]


@dataclass(slots=True, frozen=True)
class Footprint:
    """What a set of placements holds, as arrays: per pod (node, cpu, memory) and per GPU slot taken
    (node, slot, cores, MiB, MIG candidate or -1). `pod_tag`/`slot_tag` say which group (e.g. victim) each row
    belongs to."""

    pod_node: np.ndarray
    pod_cpu: np.ndarray
    pod_mem: np.ndarray
    pod_tag: np.ndarray
    slot_node: np.ndarray
    slot_idx: np.ndarray
    slot_cores: np.ndarray
    slot_mem: np.ndarray
    slot_mig: np.ndarray
    slot_tag: np.ndarray

    @classmethod
    def from_rows(cls, pods: Sequence[tuple[int, ...]], slots: Sequence[tuple[int, ...]]) -> Footprint:
        """From rows (node, cpu, memory, tag) per pod and (node, slot, cores, MiB, MIG candidate, tag) per GPU
        slot."""
        pod_cols = [np.array(c, dtype=np.int64) for c in zip(*pods, strict=True)] if pods else [_EMPTY] * 4
        slot_cols = [np.array(c, dtype=np.int64) for c in zip(*slots, strict=True)] if slots else [_EMPTY] * 6
        return cls(*pod_cols, *slot_cols)

    @classmethod
    def union(cls, parts: Sequence[Footprint]) -> Footprint:
        """All the rows of several footprints (freeing it frees what each would)."""
        return cls(*(np.concatenate([getattr(fp, f) for fp in parts]) for f in cls.__dataclass_fields__))

    def select(self, tags: np.ndarray) -> Footprint:
        """Only the rows of the groups where `tags` (a boolean per group) is true."""
        p, s = tags[self.pod_tag], tags[self.slot_tag]
        return Footprint(
            self.pod_node[p], self.pod_cpu[p], self.pod_mem[p], self.pod_tag[p],
            self.slot_node[s], self.slot_idx[s], self.slot_cores[s], self.slot_mem[s], self.slot_mig[s],
            self.slot_tag[s],
        )  # fmt: skip


_EMPTY = np.zeros(0, dtype=np.int64)
MIG_WHOLE = -2  # a Placement entry's MIG candidate meaning every slice of the card (a reservation unread)
