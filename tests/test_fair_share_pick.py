"""FairShare.pick's compiled pass over a level against the order as Python tuples give it: the least
(share ratio, dominant usage, id) among queues with work, ties on both broken by the oldest head workload,
over flat and nested trees, with equal, infinite and NaN ratios."""

from __future__ import annotations

import numpy as np

from fairgpu.framework.interfaces import ActiveQueues, EngineView
from fairgpu.model import PodSpec, QueueSpec, QueueTree, Workload
from fairgpu.plugins.sort import FairShare, _least_served


def _reference(active: ActiveQueues, view: EngineView) -> int:
    """The pick as it read in Python (min over one level's tuples)."""
    tree = view.tree
    level = tree.roots
    while True:
        live = [(float(view.share_ratio[q]), float(view.usage_dom[q]), q) for q in level if active.count[q] > 0]
        r, u, best = min(live)
        tied = [q for rq, uq, q in live if rq == r and uq == u]
        if len(tied) > 1:
            best = min(tied, key=lambda q: (_oldest(active, q), q))
        if not tree.children[best]:
            return best
        level = tree.children[best]


def _oldest(active: ActiveQueues, q: int) -> float:
    if not active.tree.children[q]:
        return active.head(q).submit_time
    return min(active.head(leaf).submit_time for leaf in active.queues if q in active.tree.ancestry[leaf])


def _trees() -> list[QueueTree]:
    flat = QueueTree([QueueSpec(f"q{i}") for i in range(7)])
    nested = QueueTree(
        [QueueSpec("a"), QueueSpec("b"), QueueSpec("c", parent="a"), QueueSpec("d", parent="a")]
        + [QueueSpec(f"e{i}", parent="b") for i in range(3)]
        + [QueueSpec(f"f{i}", parent="d") for i in range(3)]
    )
    return [flat, nested]


def test_the_compiled_pick_orders_queues_as_python_tuples_do():
    rng = np.random.default_rng(3)
    sort = FairShare()
    # few distinct values, so ties on ratio, on usage and on both are common; inf and NaN among them
    ratios = np.array([0.0, 0.5, 0.5, 1.0, np.inf, np.nan])
    usages = np.array([0.0, 0.25, 0.25, 0.5])
    checked = ties = nan_picks = 0
    for tree in _trees():
        n = len(tree)
        for _ in range(1_500):
            leaves = [q for q in tree.leaves if rng.random() < 0.7] or [tree.leaves[0]]
            submit = {q: float(rng.integers(0, 3)) for q in leaves}
            heads = {q: Workload(f"w{q}", tree.queues[q].name, (PodSpec(1, 1),), submit_time=submit[q]) for q in leaves}
            active = ActiveQueues(tree, leaves, heads.__getitem__)
            ratio = rng.choice(ratios, size=n)
            usage = rng.choice(usages, size=n)
            view = EngineView(None, tree, np.ones(4), *(np.zeros((n, 4)),) * 3, usage, np.ones(n), np.zeros(n), ratio)  # type: ignore[arg-type]
            want = _reference(active, view)
            assert sort.pick(active, view) == want
            checked += 1
            roots = [q for q in tree.roots if active.count[q] > 0]
            live = [(ratio[q], usage[q]) for q in roots]
            ties += sum(1 for x in live if x == min(live, key=lambda t: (t[0], t[1]))) > 1
            nan_picks += bool(np.isnan(ratio[roots]).any())
    assert checked == 3_000 and ties > 100 and nan_picks > 100


def test_the_least_served_of_a_level_is_the_first_of_equals_and_ties_count_only_queues_with_work():
    """Queues 1 and 2 equal in ratio and usage: the first is named, with 2 ties; queue 3 (less ratio) and
    queue 4 (equal to them) have no work and count for nothing; no queue with work: (-1, 0)."""
    ratio = np.array([0.5, 0.5, 0.5, 0.2, 0.5])
    usage = np.array([0.3, 0.2, 0.2, 0.0, 0.2])
    count = np.array([1, 1, 3, 0, 0], dtype=np.int64)
    ids = np.arange(5, dtype=np.int64)
    assert _least_served(ratio, usage, count, ids) == (1, 2)
    assert _least_served(ratio, usage, count, ids[[0, 2, 3]]) == (2, 1)
    assert _least_served(ratio, usage, np.zeros(5, dtype=np.int64), ids) == (-1, 0)
