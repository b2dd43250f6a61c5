"""Backlog's heap copies are ints (`_rank`): they must order exactly as the key tuples they stand for, and a
backlog must offer its items in the tuples' order, pushes and pops interleaved."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from fairgpu.framework.backlog import Backlog, _rank


@dataclass(eq=False)
class _Item:
    order: tuple[float, ...]
    lend_order: tuple[float, ...]
    user: str = ""
    share: float = 0.0


# near-equal, negative, signed zeros, infinities, ints beside floats and big sequence numbers
_VALUES = (-(2**40), -3, -1.5, -1e-300, -0.0, 0, 0.0, 5e-324, 1e-300, 1, 1.0, 1.0000000000000002, 7, 2**52 + 1, np.inf)
_NEG_INF = (-np.inf,)


def test_ranks_order_as_the_key_tuples_do():
    values = _VALUES + _NEG_INF
    keys = list(itertools.product(values, repeat=2))
    ranks = [_rank(k) for k in keys]
    for (a, ra), (b, rb) in itertools.product(zip(keys, ranks, strict=True), repeat=2):
        assert (ra < rb) == (a < b) and (ra == rb) == (a == b), (a, b)


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
    assert len(b) == len(pending) and b.ordered() == sorted(pending, key=lambda it: it.order)
