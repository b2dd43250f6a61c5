"""EngineView.add_usage's compiled pass against its steps written out in Python floats: the same usage rows,
dominant shares and share ratios bit for bit, over a nested tree, charges added and taken back one or many
at a time, queues entitled to nothing, and a dimension without capacity."""

from __future__ import annotations

import math

import numpy as np

from fairgpu.framework.interfaces import EngineView
from fairgpu.model import QueueSpec, QueueTree


def _reference(view: EngineView, queue: int, charges: list[np.ndarray], sign: int) -> None:
    """add_usage as it read in Python."""
    cap = view.capacity.tolist()
    add = np.add if sign > 0 else np.subtract
    for q in view.tree.ancestry[queue]:
        row = view.usage[q]
        for charge in charges:
            add(row, charge, out=row)
        dom = max([u / c for u, c in zip(row.tolist(), cap, strict=True) if c > 0], default=0.0)
        view.usage_dom[q] = dom
        held, entitled = dom + view.history_dom.item(q), view.entitled_dom.item(q)
        view.share_ratio[q] = held / entitled if entitled > 0 else math.inf


def _view(tree: QueueTree, capacity: np.ndarray, rng: np.random.Generator) -> EngineView:
    n = len(tree)
    entitled = rng.choice([0.0, 0.1, 0.3, 1 / 3], size=n)
    return EngineView(
        None,  # type: ignore[arg-type]
        tree, capacity, np.zeros((n, 4)), np.zeros((n, 4)), np.zeros((n, 4)), np.zeros(n), entitled,
        rng.choice([0.0, 0.05, 0.1], size=n), np.zeros(n),
    )  # fmt: skip


def test_the_compiled_accounting_equals_its_python_steps_bit_for_bit():
    tree = QueueTree(
        [QueueSpec("a"), QueueSpec("b"), QueueSpec("c", parent="a"), QueueSpec("d", parent="c")]
        + [QueueSpec(f"e{i}", parent="b") for i in range(3)]
    )
    rng = np.random.default_rng(11)
    for capacity in (np.array([64.0, 5.2e6, 1.0e6, 8.0e6]), np.array([64.0, 0.0, 1.0e6, 8.0e6])):
        mine, want = _view(tree, capacity, rng), _view(tree, capacity, rng)
        for name in ("entitled_dom", "history_dom"):
            getattr(want, name)[:] = getattr(mine, name)
        held: list[tuple[int, list[np.ndarray]]] = []
        for _ in range(400):
            if held and rng.random() < 0.4:
                q, charges, sign = *held.pop(int(rng.integers(len(held)))), -1
            else:
                q = int(rng.choice(tree.leaves))
                charges = [rng.random(4) * capacity / 7 for _ in range(int(rng.integers(1, 4)))]
                held.append((q, charges))
                sign = 1
            mine.add_usage(q, charges, sign)
            _reference(want, q, charges, sign)
            for name in ("usage", "usage_dom", "share_ratio"):
                assert np.array_equal(getattr(mine, name), getattr(want, name)), name
        assert np.isinf(mine.share_ratio).any() and (mine.usage_dom > 0).all()


def test_a_cluster_without_capacity_gives_usage_a_dominant_share_of_nothing():
    """No dimension with capacity (a live cluster before its nodes are seen): the dominant share is 0.0, as
    Python's max over nothing with default 0.0, and the ratio the past usage over the entitlement."""
    tree = QueueTree([QueueSpec("a")])
    view = _view(tree, np.zeros(4), np.random.default_rng(0))
    view.entitled_dom[:], view.history_dom[:] = 0.5, 0.1
    view.add_usage(0, [np.array([2.0, 1.0, 3.0, 4.0])])
    assert view.usage_dom[0] == 0.0 and view.share_ratio[0] == 0.1 / 0.5
