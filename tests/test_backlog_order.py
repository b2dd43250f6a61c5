"""Backlog's heaps keep keys as rows of floats, compared by compiled sift steps: they must offer items exactly
in the order of their key tuples, pushes and pops interleaved, stale copies dropped and heaps rebuilt."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from fairgpu.framework.backlog import Backlog, _Heap


@dataclass(eq=False)
class _Item:
    order: tuple[float, ...]
    lend_order: tuple[float, ...]
    user: str = ""
    share: float = 0.0


# near-equal, negative, signed zeros (equal, so the next field decides), infinities, ints beside floats
_VALUES = (-(2**40), -3, -1.5, -1e-300, -0.0, 0, 0.0, 5e-324, 1e-300, 1, 1.0, 1.0000000000000002, 7, 2**52 + 1)
_INF = (np.inf, -np.inf)


def test_a_backlog_offers_keys_in_the_tuples_order_whatever_their_values():
    keys = [(*k, seq) for seq, k in enumerate(itertools.product(_VALUES + _INF, repeat=2))]
    rng = np.random.default_rng(1)
    b: Backlog[_Item] = Backlog(lends=True)
    items = [_Item(k, (k[1], k[0], k[2])) for k in keys]
    for i in rng.permutation(len(items)):
        b.push(items[int(i)])
    first = sorted(keys)[: len(items) // 2]
    assert [b.pop().order for _ in first] == first
    popped = set(first)
    rest = sorted((it for it in items if it.order not in popped), key=lambda it: it.lend_order)
    assert [b.pop(lend=True) for _ in rest] == rest and not len(b)


def test_a_backlog_offers_items_in_the_tuples_order_through_pushes_and_pops():
    rng = np.random.default_rng(5)
    b: Backlog[_Item] = Backlog(lends=True)
    pending: list[_Item] = []
    for seq in range(2_000):
        if pending and rng.random() < 0.45:
            lend = bool(rng.random() < 0.5)
            got = b.pop(lend)
            want = min(pending, key=lambda it: it.lend_order if lend else it.order)
            assert got is want
            pending.remove(got)
            if rng.random() < 0.5:  # tried and pushed back
                b.push(got)
                pending.append(got)
        else:
            prio, t, run = (float(rng.choice(_VALUES[:12])) for _ in range(3))
            it = _Item((-prio, t, seq), (-prio, t + run, t, seq))
            b.push(it)
            pending.append(it)
            assert len(b._token) <= 2 * len(pending) + 17  # the ids of popped items are let go in bulk
    assert len(b) == len(pending) and b.ordered() == sorted(pending, key=lambda it: it.order)


def test_a_heap_rebuilt_from_its_live_copies_pops_them_in_order():
    """A rebuild keeps the live rows and restores heap order over them (the root included); the rows left
    behind past the end are never read again."""
    rng = np.random.default_rng(9)
    for size in range(1, 60):
        heap = _Heap(2)
        keys = {t: (float(rng.integers(0, 4)), float(t)) for t in range(size)}
        for t in rng.permutation(size).tolist():
            heap.push(keys[t], t)
        least = min(keys, key=keys.__getitem__)
        live = {t for t in range(size) if rng.random() < 0.6 and t != least}  # the root's copy is stale
        heap.keep(live)
        popped = []
        while len(heap):
            popped.append(heap.tokens.item(0))
            heap.pop()
        assert popped == sorted(live, key=keys.__getitem__)
