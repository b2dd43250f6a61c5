"""The victim table, built column by column: every running workload as a unit that could be evicted, and
each elastic workload's newest extra pod as a unit of its own (it goes first).

At 10,000 running workloads the table must be ready within a preemption decision's budget, the first
one included. So each column is one pass over the workloads' attributes (`np.fromiter`), the footprint's
rows are read from the placements in bulk and tagged with `np.repeat`, and the `VictimUnit` objects a
plugin reads are made only for the few units it looks at. Units and rows come in the running workloads'
order, each elastic workload's extra unit right after its whole one: cost ties break by that order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from operator import attrgetter

import numpy as np

from fairgpu.framework.accounting import ShareAccounting
from fairgpu.framework.engine import Entry
from fairgpu.framework.interfaces import VictimTable, VictimUnit, VictimUnits
from fairgpu.state import Footprint, Placement

_node, _cpu, _mem = attrgetter("node"), attrgetter("cpu_m"), attrgetter("memory_mib")
_slots, _cores, _gmem, _mig = attrgetter("slots"), attrgetter("cores"), attrgetter("mem_mib"), attrgetter("mig")
_placed, _pods, _needed = attrgetter("placed"), attrgetter("workload.pods"), attrgetter("workload.needed")


def _ints(values: Iterable[int], count: int) -> np.ndarray:
    return np.fromiter(values, dtype=np.int64, count=count)


def _column(entries: Sequence[Entry], name: str, dtype: type = np.int64) -> np.ndarray:
    return np.fromiter(map(attrgetter(name), entries), dtype=dtype, count=len(entries))


def build(entries: Sequence[Entry], accounting: ShareAccounting, dims: int) -> tuple[VictimTable, np.ndarray]:
    """The table over these running workloads (in this order), and each one's first unit."""
    n = len(entries)
    placed = _ints(map(len, map(_placed, entries)), n)
    extra = placed > _ints(map(_needed, entries), n)
    per = 1 + extra.astype(np.int64)  # units per workload
    first = np.cumsum(per) - per
    count = int(per.sum())
    owner = np.repeat(np.arange(n), per)
    whole = np.ones(count, dtype=bool)
    whole[first[extra] + 1] = False
    # every unit's placements in unit order: an extra unit repeats its workload's newest
    flat: list[Placement] = list(chain.from_iterable(map(_placed, entries)))
    for j, end in enumerate(np.cumsum(placed)[extra].tolist()):
        flat.insert(end + j, flat[end + j - 1])  # j extras already inserted before it
    pods_per_unit = np.where(whole, placed[owner], 1)
    starts = np.cumsum(pods_per_unit) - pods_per_unit
    pod_tag = np.repeat(np.arange(count), pods_per_unit)
    m = len(flat)
    pod_node = _ints(map(_node, flat), m)
    per_pod = _ints(map(len, map(_slots, flat)), m)
    k = int(per_pod.sum())
    if any(map(_mig, flat)):  # each entry's MIG candidate; -1 for an ordinary card
        mig = _ints(chain.from_iterable(p.mig or (-1,) * len(p.slots) for p in flat), k)
    else:
        mig = np.full(k, -1, dtype=np.int64)
    footprint = Footprint(
        pod_node, _ints(map(_cpu, flat), m), _ints(map(_mem, flat), m), pod_tag,
        np.repeat(pod_node, per_pod), _ints(chain.from_iterable(map(_slots, flat)), k),
        _ints(chain.from_iterable(map(_cores, flat)), k), _ints(chain.from_iterable(map(_gmem, flat)), k),
        mig, np.repeat(pod_tag, per_pod),
    )  # fmt: skip
    # What each unit holds: a complete workload its whole charge (the very sum), else its placed pods'.
    charge = np.empty((count, dims))
    charge[first] = np.array(list(map(attrgetter("charge"), entries)), dtype=np.float64).reshape(n, dims)
    partial = placed < _ints(map(len, map(_pods, entries)), n)
    for i in np.flatnonzero(partial | extra).tolist():
        pods, p = entries[i].workload.pods, int(placed[i])
        charge[first[i]] = accounting.charge_of(pods[:p])
        if extra[i]:
            charge[first[i] + 1] = accounting.charge_of(pods[p - 1 : p])
    started = _column(entries, "started", np.float64)[owner]

    def unit(u: int) -> VictimUnit:
        e, p, a = entries[int(owner[u])], int(placed[owner[u]]), int(starts[u])
        pods = tuple(range(p)) if whole[u] else (p - 1,)
        at = tuple(flat[a : a + len(pods)])
        return VictimUnit(e.workload, e.queue, float(started[u]), pods, at, charge[u], bool(whole[u]))

    table = VictimTable(
        VictimUnits(count, unit),
        _column(entries, "queue")[owner],
        started,
        _column(entries, "workload.priority")[owner],
        _column(entries, "workload.preemptible", bool)[owner],
        whole,
        charge,
        footprint,
        ~_column(entries, "terminating", bool)[owner],
    )
    return table, first
