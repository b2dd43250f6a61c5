"""Fairness math: weighted DRF water-filling among siblings and hierarchical entitlements.

Resource vectors are over FAIR_DIMS = (gpu, gpumem, cpu, memory).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairgpu.fairness import dominant_shares, entitlements, water_fill
from fairgpu.model import QueueSpec, QueueTree

INF = np.inf
R = 4
FAST = settings(max_examples=200, deadline=None)


def vec(gpu: float = 0.0, gpumem: float = 0.0, cpu: float = 0.0, memory: float = 0.0) -> np.ndarray:
    return np.array([gpu, gpumem, cpu, memory], dtype=np.float64)


def fill(capacity, demand, weight=None, guaranteed=None, limit=None) -> np.ndarray:
    demand = np.array(demand, dtype=np.float64)
    q = len(demand)
    return water_fill(
        np.asarray(capacity, dtype=np.float64),
        demand,
        np.ones(q) if weight is None else np.asarray(weight, dtype=np.float64),
        np.zeros((q, R)) if guaranteed is None else np.array(guaranteed, dtype=np.float64),
        np.full((q, R), INF) if limit is None else np.array(limit, dtype=np.float64),
    )


def spec(name, parent=None, weight=1.0, guaranteed=None, limit=None) -> QueueSpec:
    g = np.zeros(R) if guaranteed is None else np.asarray(guaranteed, dtype=np.float64)
    lim = np.full(R, INF) if limit is None else np.asarray(limit, dtype=np.float64)
    return QueueSpec(name, weight, g, lim, parent)


def entitle(tree: QueueTree, capacity: np.ndarray, demands: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    d = np.zeros((len(tree), R))
    for name, v in demands.items():
        d[tree.index[name]] = v
    ent = entitlements(tree, capacity, d)
    return {name: ent[i] for i, name in enumerate(tree.names())}


GPUS = vec(gpu=10, gpumem=0, cpu=0, memory=0)

# -- water_fill: hand-computed cases ------------------------------------------------------------------------------


def test_equal_weights_split_equally() -> None:
    alloc = fill(vec(gpu=12, cpu=1000), [vec(gpu=20), vec(gpu=20), vec(gpu=20)])
    assert alloc[:, 0] == pytest.approx([4, 4, 4])
    assert alloc[:, 1:] == pytest.approx(np.zeros((3, 3)))


def test_weights_3_to_1() -> None:
    alloc = fill(GPUS, [vec(gpu=20), vec(gpu=20)], weight=[3, 1])
    assert alloc[:, 0] == pytest.approx([7.5, 2.5])


def test_small_demand_is_met_and_the_rest_redistributed() -> None:
    alloc = fill(GPUS, [vec(gpu=2), vec(gpu=10), vec(gpu=10)])
    assert alloc[:, 0] == pytest.approx([2, 4, 4])


def test_nothing_demanded_nothing_given() -> None:
    assert fill(GPUS, [vec(), vec()]).tolist() == np.zeros((2, R)).tolist()
    alloc = fill(GPUS, [vec(), vec(gpu=3)])
    assert alloc[0].tolist() == [0.0] * R
    assert alloc[1, 0] == pytest.approx(3)


def test_undersubscribed_everyone_gets_its_demand() -> None:
    demand = [vec(gpu=2, cpu=100), vec(gpu=3, memory=50), vec(cpu=300)]
    alloc = fill(vec(gpu=10, cpu=1000, memory=1000), demand)
    assert alloc == pytest.approx(np.array(demand))


def test_guarantee_honoured() -> None:
    # Without the guarantee a would get 2.5 (weights 1:3); its guarantee of 4 covers its demand of 4.
    alloc = fill(GPUS, [vec(gpu=4), vec(gpu=10)], weight=[1, 3], guaranteed=[vec(gpu=4), vec()])
    assert alloc[:, 0] == pytest.approx([4, 6])
    assert fill(GPUS, [vec(gpu=4), vec(gpu=10)], weight=[1, 3])[:, 0] == pytest.approx([2.5, 7.5])


def test_guarantee_never_exceeds_demand() -> None:
    alloc = fill(GPUS, [vec(gpu=1), vec(gpu=20)], guaranteed=[vec(gpu=8), vec()])
    assert alloc[:, 0] == pytest.approx([1, 9])


def test_guarantee_with_unconstrained_dimensions() -> None:
    # The scenario loader fills unnamed guarantee dimensions with inf ("not constrained"): a guarantee of
    # 6 GPUs covers pods that also need CPU.
    capacity = vec(gpu=10, cpu=100_000)
    demand = [vec(gpu=6, cpu=6000), vec(gpu=20, cpu=20_000)]
    guaranteed = [vec(gpu=6, gpumem=INF, cpu=INF, memory=INF), vec()]
    alloc = fill(capacity, demand, weight=[1, 5], guaranteed=guaranteed)
    assert alloc[0] == pytest.approx(vec(gpu=6, cpu=6000))
    assert alloc[1] == pytest.approx(vec(gpu=4, cpu=4000))


def test_overcommitted_guarantees_are_scaled_down_together() -> None:
    alloc = fill(GPUS, [vec(gpu=20), vec(gpu=20)], guaranteed=[vec(gpu=12), vec(gpu=8)])
    assert alloc[:, 0].sum() == pytest.approx(10)
    assert alloc[0, 0] >= alloc[1, 0] - 1e-9  # the bigger guarantee keeps the bigger part


def test_limit_caps_and_the_rest_goes_to_others() -> None:
    alloc = fill(GPUS, [vec(gpu=10), vec(gpu=10)], limit=[vec(gpu=3, gpumem=INF, cpu=INF, memory=INF), np.full(R, INF)])
    assert alloc[:, 0] == pytest.approx([3, 7])


def test_limit_in_another_dimension_caps_the_whole_mix() -> None:
    # Pods need 1 GPU + 1000m CPU each; a 2000m CPU limit therefore allows 2 GPUs' worth.
    alloc = fill(
        vec(gpu=10, cpu=100_000),
        [vec(gpu=10, cpu=10_000), vec(gpu=10)],
        limit=[vec(gpu=INF, gpumem=INF, cpu=2000, memory=INF), np.full(R, INF)],
    )
    assert alloc[0] == pytest.approx(vec(gpu=2, cpu=2000))
    assert alloc[1] == pytest.approx(vec(gpu=8))


def test_drf_paper_example() -> None:
    # Ghodsi et al. 2011: 9 CPUs, 18 GB; A's tasks need <1 CPU, 4 GB>, B's <3 CPU, 1 GB>.
    alloc = fill(
        vec(cpu=9000, memory=18 * 1024), [vec(cpu=100_000, memory=400 * 1024), vec(cpu=300_000, memory=100 * 1024)]
    )
    assert alloc[0] == pytest.approx(vec(cpu=3000, memory=12 * 1024))
    assert alloc[1] == pytest.approx(vec(cpu=6000, memory=2 * 1024))


def test_allocation_keeps_the_demand_mix() -> None:
    alloc = fill(vec(gpu=4, cpu=100_000, memory=100_000), [vec(gpu=8, cpu=16_000, memory=32_000), vec(gpu=8)])
    a = alloc[0]
    assert a[0] == pytest.approx(2)
    assert a[2] / a[0] == pytest.approx(2000) and a[3] / a[0] == pytest.approx(4000)


def test_cpu_only_queue_keeps_filling_after_gpus_run_out() -> None:
    capacity = vec(gpu=10, cpu=100_000)
    alloc = fill(capacity, [vec(gpu=10, cpu=10_000), vec(gpu=10), vec(cpu=100_000)])
    assert alloc[0] == pytest.approx(vec(gpu=5, cpu=5000))
    assert alloc[1] == pytest.approx(vec(gpu=5))
    assert alloc[2] == pytest.approx(vec(cpu=95_000))  # everything the GPU queues cannot use


def test_demand_for_a_resource_nobody_has_gets_nothing() -> None:
    alloc = fill(vec(cpu=8000), [vec(gpu=1, cpu=1000), vec(cpu=10_000)])
    assert alloc[0].tolist() == [0.0] * R
    assert alloc[1] == pytest.approx(vec(cpu=8000))


def test_zero_capacity_everywhere() -> None:
    assert fill(vec(), [vec(gpu=1), vec(cpu=1)]).tolist() == np.zeros((2, R)).tolist()


def test_water_fill_with_no_queues() -> None:
    assert fill(GPUS, np.zeros((0, R))).shape == (0, R)


def test_negative_demand_is_treated_as_none() -> None:
    alloc = fill(GPUS, [vec(gpu=-5), vec(gpu=20)])
    assert alloc[:, 0] == pytest.approx([0, 10])


# -- entitlements: hand-computed cases -----------------------------------------------------------------------


def test_parent_allocation_split_among_children() -> None:
    tree = QueueTree([spec("a"), spec("b"), spec("a1", "a"), spec("a2", "a", weight=3)])
    ent = entitle(tree, vec(gpu=16), {"a1": vec(gpu=100), "a2": vec(gpu=100), "b": vec(gpu=100)})
    assert ent["a"][0] == pytest.approx(8) and ent["b"][0] == pytest.approx(8)
    assert ent["a1"][0] == pytest.approx(2) and ent["a2"][0] == pytest.approx(6)


def test_parent_demand_is_its_subtree() -> None:
    # b's children want 3 in all, so a gets the other 7 although a and b weigh the same.
    tree = QueueTree([spec("a"), spec("b"), spec("b1", "b"), spec("b2", "b")])
    ent = entitle(tree, GPUS, {"a": vec(gpu=100), "b1": vec(gpu=1), "b2": vec(gpu=2)})
    assert [ent[n][0] for n in ("a", "b", "b1", "b2")] == pytest.approx([7, 3, 1, 2])


def test_idle_queues_are_entitled_to_nothing() -> None:
    tree = QueueTree([spec("a"), spec("b"), spec("b1", "b"), spec("c", weight=5)])
    ent = entitle(tree, GPUS, {"a": vec(gpu=100)})
    assert ent["a"][0] == pytest.approx(10)
    for name in ("b", "b1", "c"):
        assert ent[name].tolist() == [0.0] * R


def test_limit_on_an_inner_queue_caps_its_subtree() -> None:
    no_limit = {"gpumem": INF, "cpu": INF, "memory": INF}
    tree = QueueTree(
        [
            spec("org", weight=10, limit=vec(gpu=6, **no_limit)),
            spec("other"),
            spec("team", "org"),
            spec("misc", "org"),
        ]
    )
    ent = entitle(tree, GPUS, {"team": vec(gpu=100), "misc": vec(gpu=100), "other": vec(gpu=100)})
    assert ent["org"][0] == pytest.approx(6)  # weight 10 of 11 would be 9.09
    assert ent["other"][0] == pytest.approx(4)
    assert ent["team"][0] == pytest.approx(3) and ent["misc"][0] == pytest.approx(3)


def test_nested_guarantee_honoured_against_heavier_siblings() -> None:
    g = {"gpumem": INF, "cpu": INF, "memory": INF}
    tree = QueueTree(
        [
            spec("org", guaranteed=vec(gpu=4, **g)),
            spec("other", weight=10),
            spec("team", "org", guaranteed=vec(gpu=4, **g)),
            spec("misc", "org", weight=10),
        ]
    )
    ent = entitle(tree, GPUS, {"team": vec(gpu=100), "misc": vec(gpu=100), "other": vec(gpu=100)})
    assert ent["org"][0] >= 4 - 1e-9
    assert ent["team"][0] >= 4 - 1e-9
    assert ent["team"][0] + ent["misc"][0] == pytest.approx(ent["org"][0])
    assert ent["org"][0] + ent["other"][0] == pytest.approx(10)


def test_cpu_only_child_keeps_filling_after_gpus_run_out() -> None:
    """Work conservation across levels.

    team has a GPU-only child and a CPU-only child; a sibling queue other wants only GPUs. GPUs split 5/5.
    Nobody else wants CPU, so the CPU-only child should get all 100 cores (as it does in a flat tree, see
    test_cpu_only_queue_keeps_filling_after_gpus_run_out). A parent filled along its *summed* demand mix
    stops when GPUs run out, leaving cpu-child 50 cores and 50 idle (what 57779d9 did).
    """
    tree = QueueTree([spec("team"), spec("other"), spec("gpu-child", "team"), spec("cpu-child", "team")])
    ent = entitle(
        tree,
        vec(gpu=10, cpu=100_000),
        {"gpu-child": vec(gpu=10), "cpu-child": vec(cpu=100_000), "other": vec(gpu=10)},
    )
    assert ent["gpu-child"] == pytest.approx(vec(gpu=5))
    assert ent["other"] == pytest.approx(vec(gpu=5))
    assert ent["cpu-child"] == pytest.approx(vec(cpu=100_000))


def test_nested_guarantee_honoured_for_a_child_with_a_different_mix() -> None:
    """A child's guarantee, nested inside its parent's guarantee, must hold whatever its siblings want.

    Capacity 10 GPU / 10,000m CPU. org (guaranteed 4 GPU + 4000m) has gpu-team (guaranteed 4 GPU, wants 10
    GPU) and cpu-team (guaranteed 4000m, wants 2000m). A heavy sibling (weight 10) wants everything.
    cpu-team asks for less than its guarantee, so it should get its 2000m. Filling org along its summed
    demand (10 GPU : 2000m), its guarantee binds on GPUs at 4 GPU : 800m and cpu-team gets 800m (57779d9).
    """
    g = {"gpumem": INF, "memory": INF}
    tree = QueueTree(
        [
            spec("org", guaranteed=vec(gpu=4, cpu=4000, **g)),
            spec("heavy", weight=10),
            spec("gpu-team", "org", guaranteed=vec(gpu=4, cpu=INF, **g)),
            spec("cpu-team", "org", guaranteed=vec(gpu=INF, cpu=4000, **g)),
        ]
    )
    ent = entitle(
        tree,
        vec(gpu=10, cpu=10_000),
        {"gpu-team": vec(gpu=10), "cpu-team": vec(cpu=2000), "heavy": vec(gpu=100, cpu=100_000)},
    )
    assert ent["gpu-team"][0] >= 4 - 1e-9
    assert ent["cpu-team"] == pytest.approx(vec(cpu=2000))


def test_dominant_shares() -> None:
    cap = vec(gpu=10, cpu=1000)
    shares = dominant_shares(np.array([vec(gpu=2, cpu=500), vec(gpu=5), vec(memory=99)]), cap)
    assert shares == pytest.approx([0.5, 0.5, 0.0])  # memory has no capacity: ignored
    assert dominant_shares(np.array([vec(gpu=1)]), vec()).tolist() == [0.0]


# -- property tests ---------------------------------------------------------------------------------------------

TOL = 1e-6


def _bound(vec_: np.ndarray, demand: np.ndarray) -> float:
    """Largest fraction f of `demand` with f·demand ≤ vec_ in every dimension it uses."""
    used = demand > 1e-12
    if not used.any():
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.min(vec_[used] / demand[used]))


capacities = st.builds(
    vec,
    gpu=st.integers(1, 64),
    gpumem=st.integers(1, 64).map(lambda n: n * 40960.0),
    cpu=st.integers(1, 256).map(lambda n: n * 1000.0),
    memory=st.integers(1, 256).map(lambda n: n * 4096.0),
)
fractions = st.one_of(st.just(0.0), st.just(0.0), st.floats(0.01, 2.0), st.just(5.0))


@st.composite
def demand_vectors(draw: st.DrawFn, capacity: np.ndarray) -> np.ndarray:
    return np.array([draw(fractions) for _ in range(R)]) * capacity


@st.composite
def siblings(draw: st.DrawFn, with_guarantees: bool, with_limits: bool):
    capacity = draw(capacities)
    q = draw(st.integers(1, 6))
    demand = np.array([draw(demand_vectors(capacity)) for _ in range(q)]).reshape(q, R)
    weight = np.array([draw(st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0, 10.0])) for _ in range(q)])
    guaranteed = np.zeros((q, R))
    if with_guarantees:
        # Each queue gets a fraction of the capacity; fractions sum to at most 1, so guarantees fit.
        parts = np.array([draw(st.floats(0.0, 1.0)) for _ in range(q + 1)])
        parts = parts / max(parts.sum(), 1e-9)
        for i in range(q):
            guaranteed[i] = parts[i] * capacity * np.array([draw(st.sampled_from([1.0, 1.0, 0.5])) for _ in range(R)])
    limit = np.full((q, R), INF)
    if with_limits:
        for i in range(q):
            if draw(st.booleans()):
                limit[i] = np.array([draw(st.one_of(st.just(INF), st.floats(0.0, 1.5))) for _ in range(R)]) * capacity
    return capacity, demand, weight, guaranteed, limit


def _check_feasible(alloc, capacity, demand, limit) -> None:
    tol = TOL * (capacity + 1.0)
    assert (alloc >= -tol).all()
    assert (alloc <= np.maximum(demand, 0) + tol).all(), "allocation above demand"
    assert (alloc <= limit + tol).all(), "allocation above limit"
    assert (alloc.sum(axis=0) <= capacity + tol * len(alloc)).all(), "allocation above capacity"


def _check_mix(alloc, demand) -> None:
    """Each queue's allocation is a fraction of its demand vector (its pods' mix)."""
    for a, d in zip(alloc, demand, strict=True):
        used = d > 1e-12
        if not used.any():
            assert np.allclose(a, 0)
            continue
        f = a[used] / d[used]
        assert f.max() - f.min() <= 1e-6, (a, d)
        assert np.allclose(a[~used], 0)


def _check_bottlenecked(alloc, capacity, demand, limit) -> None:
    """Pareto efficiency of progressive filling: every queue gets its demand (up to its limit), or some
    resource its pods need is used up."""
    total = alloc.sum(axis=0)
    saturated = total >= capacity * (1 - 1e-6)
    for i, (a, d) in enumerate(zip(alloc, demand, strict=True)):
        used = d > 1e-12
        if not used.any() or (capacity[used] <= 0).any():
            continue
        target = min(1.0, _bound(limit[i], d))
        got = float(np.max(a[used] / d[used]))
        if got >= target - 1e-6:
            continue
        assert saturated[used].any(), (
            f"queue {i} gets {got:.6f} of its demand (could take {target:.6f}) though no resource it "
            f"needs is used up: alloc {a}, demand {d}, total {total}, capacity {capacity}"
        )


@FAST
@given(siblings(with_guarantees=True, with_limits=True))
def test_water_fill_is_feasible(case) -> None:
    capacity, demand, weight, guaranteed, limit = case
    alloc = water_fill(capacity, demand, weight, guaranteed, limit)
    assert alloc.shape == demand.shape
    _check_feasible(alloc, capacity, demand, limit)
    _check_mix(alloc, demand)


@FAST
@given(siblings(with_guarantees=False, with_limits=True))
def test_water_fill_is_work_conserving(case) -> None:
    capacity, demand, weight, guaranteed, limit = case
    alloc = water_fill(capacity, demand, weight, guaranteed, limit)
    _check_bottlenecked(alloc, capacity, demand, limit)


@FAST
@given(siblings(with_guarantees=True, with_limits=False))
def test_water_fill_work_conserving_with_guarantees(case) -> None:
    capacity, demand, weight, guaranteed, limit = case
    alloc = water_fill(capacity, demand, weight, guaranteed, limit)
    _check_bottlenecked(alloc, capacity, demand, limit)


@FAST
@given(st.data())
def test_water_fill_single_resource_demands_use_up_each_resource(data) -> None:
    """When every queue needs one resource only, each resource is either used up or every queue that wants
    it is fully served. (With mixed demands DRF cannot promise this per resource: a queue whose pods need
    GPU + CPU stops taking CPU when GPUs run out; see test_water_fill_is_work_conserving.)"""
    capacity = data.draw(capacities)
    q = data.draw(st.integers(1, 6))
    demand = np.zeros((q, R))
    for i in range(q):
        r = data.draw(st.integers(0, R - 1))
        demand[i, r] = data.draw(st.one_of(st.just(0.0), st.floats(0.01, 3.0))) * capacity[r]
    weight = np.array([data.draw(st.sampled_from([1.0, 2.0, 5.0])) for _ in range(q)])
    alloc = water_fill(capacity, demand, weight, np.zeros((q, R)), np.full((q, R), INF))
    total = alloc.sum(axis=0)
    for r in range(R):
        wanting = demand[:, r] > 0
        if not wanting.any():
            continue
        assert total[r] >= capacity[r] * (1 - 1e-6) or np.allclose(alloc[wanting, r], demand[wanting, r]), (
            r,
            alloc,
            demand,
            capacity,
        )


@FAST
@given(siblings(with_guarantees=True, with_limits=True))
def test_water_fill_honours_guarantees(case) -> None:
    capacity, demand, weight, guaranteed, limit = case
    alloc = water_fill(capacity, demand, weight, guaranteed, limit)
    for i in range(len(demand)):
        d = demand[i]
        used = d > 1e-12
        if not used.any():
            continue
        floor = min(1.0, _bound(guaranteed[i], d), _bound(limit[i], d))
        got = float(np.max(alloc[i][used] / d[used]))
        assert got >= floor - 1e-6, (i, got, floor, alloc[i], d, guaranteed[i])


@FAST
@given(
    capacity=capacities,
    mix=st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=R, max_size=R).filter(any),
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 7.0]), min_size=1, max_size=6),
    backlog=st.data(),
)
def test_water_fill_backlogged_shares_follow_weights(capacity, mix, weights, backlog) -> None:
    direction = np.array(mix) / max(mix)
    q = len(weights)
    demand = np.array([direction * capacity * backlog.draw(st.floats(1.0, 4.0)) for _ in range(q)])
    w = np.array(weights)
    alloc = water_fill(capacity, demand, w, np.zeros((q, R)), np.full((q, R), INF))
    shares = dominant_shares(alloc, capacity)
    assert shares == pytest.approx(w / w.sum(), rel=1e-6)


# -- hierarchical property tests ------------------------------------------------------------------------------


@st.composite
def queue_trees(draw: st.DrawFn, guarantees: bool = False, limits: bool = False):
    """A random forest of 1-3 levels, its capacity and leaf demands; specs arrive in shuffled order."""
    capacity = draw(capacities)
    names: list[tuple[str, str | None]] = []

    def add(parent: str | None, depth: int) -> None:
        for _ in range(draw(st.integers(1, 3))):
            name = f"q{len(names)}"
            names.append((name, parent))
            if depth < 3 and draw(st.booleans()):
                add(name, depth + 1)

    add(None, 1)
    weight = {n: draw(st.sampled_from([0.5, 1.0, 1.0, 2.0, 4.0])) for n, _ in names}
    guaranteed = {n: np.zeros(R) for n, _ in names}
    if guarantees:
        # Nested guarantees: siblings share out (at most) their parent's guarantee, roots the capacity.
        def share_out(parent: str | None, budget: np.ndarray) -> None:
            kids = [n for n, p in names if p == parent]
            parts = np.array([draw(st.floats(0.0, 1.0)) for _ in range(len(kids) + 1)])
            parts = parts / max(parts.sum(), 1e-9)
            for k, part in zip(kids, parts, strict=False):
                guaranteed[k] = budget * part
                share_out(k, guaranteed[k])

        share_out(None, capacity.copy())
    limit = {n: np.full(R, INF) for n, _ in names}
    if limits:
        for n, _ in names:
            if draw(st.booleans()):
                limit[n] = np.array([draw(st.one_of(st.just(INF), st.floats(0.0, 1.0))) for _ in range(R)]) * capacity
    specs = [QueueSpec(n, weight[n], guaranteed[n], limit[n], p) for n, p in names]
    tree = QueueTree(draw(st.permutations(specs)))
    demand = np.zeros((len(tree), R))
    for i in tree.leaves:
        demand[i] = draw(demand_vectors(capacity))
    return tree, capacity, demand


def _subtree_demand(tree: QueueTree, leaf_demand: np.ndarray) -> np.ndarray:
    d = leaf_demand.copy()
    for i in reversed(range(len(tree))):
        if tree.parent[i] >= 0:
            d[tree.parent[i]] += d[i]
    return d


@FAST
@given(queue_trees(guarantees=True, limits=True))
def test_entitlements_are_feasible(case) -> None:
    tree, capacity, demand = case
    ent = entitlements(tree, capacity, demand)
    tol = TOL * (capacity + 1.0) * len(tree)
    sub = _subtree_demand(tree, demand)
    assert ent.shape == demand.shape
    assert (ent >= -tol).all()
    assert (ent <= sub + tol).all(), "entitled above demand"
    assert (ent <= tree.limit + tol).all(), "entitled above limit"
    assert (ent[tree.roots].sum(axis=0) <= capacity + tol).all(), "roots above capacity"
    assert (ent[tree.leaves].sum(axis=0) <= capacity + tol).all(), "leaves above capacity"
    for i, kids in enumerate(tree.children):
        if kids:
            assert (ent[kids].sum(axis=0) <= ent[i] + tol).all(), "children above their parent"
    for i in tree.leaves:
        if not (demand[i] > 0).any():
            assert (ent[i] == 0).all(), "a queue that wants nothing is entitled to nothing"


@FAST
@given(
    queue_trees(),
    st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=R, max_size=R).filter(any),
    st.data(),
)
def test_entitlements_backlogged_shares_follow_weights(case, mix, data) -> None:
    """All leaves backlogged with the same mix, no guarantees or limits: every sibling group splits its
    parent's entitlement in proportion to weight, and the whole cluster is handed out."""
    tree, capacity, _ = case
    direction = np.array(mix) / max(mix)
    demand = np.zeros((len(tree), R))
    for i in tree.leaves:
        demand[i] = direction * capacity * data.draw(st.floats(1.0, 4.0))
    ent = entitlements(tree, capacity, demand)
    np.testing.assert_allclose(ent[tree.roots].sum(axis=0), direction * capacity, rtol=1e-6)
    for parent, group in [(None, tree.roots)] + [(i, tree.children[i]) for i in range(len(tree))]:
        if not group:
            continue
        w = tree.weight[group]
        total = capacity * direction if parent is None else ent[parent]
        expect = np.outer(w / w.sum(), total)
        np.testing.assert_allclose(ent[group], expect, rtol=1e-6, atol=1e-9)


SMALL = vec(gpu=1, gpumem=40960, cpu=1000, memory=4096)


def _one_team(children: dict[str, tuple[np.ndarray, np.ndarray]], team_guarantee: np.ndarray) -> tuple:
    """One root "team" and its leaves (name -> (guarantee, demand)), on the SMALL cluster."""
    specs = [spec("team", guaranteed=team_guarantee)]
    specs += [spec(n, "team", guaranteed=g) for n, (g, _) in children.items()]
    tree = QueueTree(specs)
    demand = np.zeros((len(tree), R))
    for n, (_, d) in children.items():
        demand[tree.index[n]] = d
    return tree, SMALL.copy(), demand


# The leaf "mem-only" is alone with a CPU-hungry sibling; nobody else wants memory, so it should get all
# 4096 MiB. 57779d9 gave it 819.2: "team" was filled along its summed mix (5000m : 4096 MiB) and stopped
# when CPU ran out.
MEM_ONLY_STARVED = _one_team(
    {"cpu-heavy": (vec(), vec(cpu=5000)), "mem-only": (vec(), vec(memory=4096))}, team_guarantee=vec()
)
# "cpu-team" is guaranteed the whole cluster (as is its parent) and wants all 1000m CPU; 57779d9 gave it
# 200m because its sibling wants 5x the memory there is.
CPU_TEAM_SHORTCHANGED = _one_team(
    {"mem-hungry": (vec(), vec(memory=20480)), "cpu-team": (SMALL.copy(), vec(cpu=1000))},
    team_guarantee=SMALL.copy(),
)


@FAST
@example(MEM_ONLY_STARVED)
@given(queue_trees())
def test_entitlements_are_work_conserving(case) -> None:
    """No guarantees or limits: each leaf gets its whole demand, or some resource its pods need is used up
    across the cluster. Nothing some leaf could use is left idle (fairness.py's module docstring, and
    ARCHITECTURE.md "Work-conserving")."""
    tree, capacity, demand = case
    ent = entitlements(tree, capacity, demand)
    leaves = np.array(tree.leaves)
    _check_bottlenecked(ent[leaves], capacity, demand[leaves], np.full((len(leaves), R), INF))


@FAST
@example(CPU_TEAM_SHORTCHANGED)
@given(queue_trees(guarantees=True))
def test_entitlements_honour_nested_guarantees(case) -> None:
    """Guarantees nest (siblings' guarantees sum to at most their parent's, roots' to the capacity): every
    leaf is entitled to at least min(guarantee, demand) along its demand's mix, in dominant-share terms.
    Any correct implementation can do this: those floors are each within the leaf's guarantee, so together
    they fit in the capacity."""
    tree, capacity, demand = case
    ent = entitlements(tree, capacity, demand)
    for i in tree.leaves:
        d = demand[i]
        used = d > 1e-12
        if not used.any():
            continue
        floor = min(1.0, _bound(tree.guaranteed[i], d))
        got = float(np.max(ent[i][used] / d[used]))
        assert got >= floor - 1e-6, (
            f"{tree.names()[i]}: entitled {ent[i]} = {got:.4f} of demand {d}, guaranteed {tree.guaranteed[i]} "
            f"covers {floor:.4f} of it"
        )


@FAST
@given(queue_trees(guarantees=False, limits=False), st.data())
def test_equal_siblings_get_equal_entitlements(case, data) -> None:
    """Two sibling leaves with the same weight, guarantee, limit and demand are entitled to the same,
    whatever the rest of the tree wants."""
    tree, capacity, demand = case
    pairs = [
        (a, b)
        for kids in [tree.roots, *tree.children]
        for a in kids
        for b in kids
        if a < b and tree.is_leaf[a] and tree.is_leaf[b]
    ]
    if not pairs:
        return
    a, b = data.draw(st.sampled_from(pairs))
    tree.weight[b] = tree.weight[a]
    demand[b] = demand[a]
    ent = entitlements(tree, capacity, demand)
    np.testing.assert_allclose(ent[a], ent[b], rtol=1e-6, atol=TOL * (capacity.max() + 1.0))
