"""Fragmentation's scores stay finite on the degenerate inputs a live cluster can present (a soak logged "invalid
value encountered in matmul" once, at `usable @ self._w`, and never again). Every value the product reads is
built finite: `usable` is a 0/1 fit times free GPU cores (integers, at most a node's cards × 100), `_w` the
mix (counts over a total kept ≥ 1e-9) times power-of-two boosts whose ratios divide by at least 1. This
drives the plugin, compiled and NumPy paths, through every edge named in the report (nodes with no GPUs, no
CPU, no memory, cards with 0 cores; CPU-only pods, 0-core and 0-memory GPU pods, a mix learned only from
0-core pods so its total is 0; pods placed and deleted) and checks each intermediate; the NumPy path runs
with floating-point errors raised, so a NaN or inf made on the way, not just one that survives, fails."""

from __future__ import annotations

import copy

import numpy as np

from fairgpu.catalog import load_profile
from fairgpu.framework.placement import feasible, place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree
from fairgpu.plugins.fragmentation import Fragmentation


def nodes() -> list[NodeSpec]:
    cards = lambda n, cores=100: tuple(GpuDevice("A40", 46068, f"g{n}-{j}", cores=cores) for j in range(2))  # noqa: E731
    return [
        NodeSpec("no-gpus", 64_000, 256 << 10),
        NodeSpec("no-cpu", 0, 256 << 10, cards(1)),
        NodeSpec("no-memory", 64_000, 0, cards(2)),
        NodeSpec("zero-cores", 64_000, 256 << 10, cards(3, cores=0)),
        NodeSpec("normal", 64_000, 256 << 10, cards(4)),
        NodeSpec("one-card", 8_000, 32 << 10, cards(5)[:1]),
    ]


# 0-core pods first: by demand they weigh nothing, so the mix's total is 0 until a pod with cores comes
PODS = [
    PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 0, 1024)),
    PodSpec(cpu_m=0, memory_mib=0, gpu=GpuRequest(1, 0, 0, 0)),
    PodSpec(cpu_m=0, memory_mib=0),
    PodSpec(cpu_m=1000, memory_mib=0, gpu=GpuRequest(1, 30, 2048)),
    PodSpec(cpu_m=2000, memory_mib=4096, gpu=GpuRequest(2, 100, 0, 100)),
    PodSpec(cpu_m=64_000, memory_mib=1024, gpu=GpuRequest(1, 100, 0, 100)),
    PodSpec(cpu_m=500, memory_mib=300 << 10, gpu=GpuRequest(1, 50, 1024)),
]


def frag(sched: Scheduler) -> Fragmentation:
    return next(p for p, _ in sched.profile.score if isinstance(p, Fragmentation))


def finite(f: Fragmentation) -> None:
    agg = f._agg
    assert agg is not None and agg.usable is not None
    for name, a in (
        ("usable", agg.usable),
        ("fit_free", agg.fit_free),
        ("room", agg.room),
        ("_w", f._w),
        ("_p", f._mix.p),
    ):
        assert np.isfinite(a).all(), (name, a)
    assert (
        np.isfinite(f._mix.cpu_only_per_core)
        and np.isfinite(f._mix.need_cpu).all()
        and np.isfinite(f._mix.need_gpu).all()
    )


def priced_afresh(f: Fragmentation) -> None:
    """Every node's cached need and price are what pricing all nodes afresh under the current mix and weights
    gives, bit for bit (the plugin reprices only the nodes a change of rows, mix or weights can move)."""
    from fairgpu.plugins.fragmentation_cpu import need_and_price

    agg = f._agg
    assert agg is not None and agg.usable is not None
    need, price = need_and_price(agg, f._mix, f._w, np.arange(len(agg.need)), f.compiled)
    assert np.array_equal(agg.need, need) and np.array_equal(agg.price, price), f.compiled


def test_fragmentation_scores_stay_finite_on_degenerate_nodes_and_pods():
    sched = Scheduler(nodes(), QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    view, compiled = sched.view, frag(sched)
    plain = copy.deepcopy(compiled)
    plain.compiled = False
    rng = np.random.default_rng(3)
    placed: list[str] = []
    scored = 0
    for i in range(120):
        pod = PODS[i] if i < len(PODS) else PODS[int(rng.integers(len(PODS)))]
        key = f"p{i}"
        mask = feasible(pod, view, sched.profile)
        plain.learn(key, pod)
        with np.errstate(all="raise"):
            b = plain.score(pod, view, mask)
        p = place_pod(pod, view, sched.profile, key=key)  # the compiled plugin learns the pod here
        a = compiled.score(pod, view, mask)
        if compiled._mix.keys:
            finite(compiled)
            finite(plain)
            priced_afresh(compiled)
            priced_afresh(plain)
            assert np.isfinite(a[mask.nodes]).all() and np.isfinite(b[mask.nodes]).all(), (pod, a, b)
            scored += int(mask.nodes.any())
        if p is not None:
            view.state.assign(key, p)
            placed.append(key)
        if placed and rng.random() < 0.4:
            view.state.release(placed.pop(int(rng.integers(len(placed)))))
    assert scored > 60 and compiled._mix.p_total > 0 and len(compiled._mix.keys) >= 5, (scored, compiled._mix.keys)


def test_cached_need_and_price_are_a_fresh_pricing_under_the_weights_after_each_boost():
    """One shape (1-GPU pods) on eight 2-GPU nodes under the scarcity boost: as nodes fill, its hosts fall
    8, 7, ..., so its weight doubles now and then without a new mix. Only the weights moved, so the plugin
    reprices just the nodes where a moved shape counts (`_moved`, `_counting`); every node's cached need
    and price must still be what pricing all nodes afresh gives, bit for bit, compiled and NumPy (the
    unmoved shapes taken for the moved ones left the other free nodes at the old weight)."""
    cards = lambda n: tuple(GpuDevice("A40", 46068, f"g{n}-{j}") for j in range(2))  # noqa: E731
    sched = Scheduler(
        [NodeSpec(f"n{i}", 32_000, 256 << 10, cards(i)) for i in range(8)],
        QueueTree([QueueSpec("q")]),
        load_profile("fairgpu"),
    )
    view, compiled = sched.view, frag(sched)
    plain = copy.deepcopy(compiled)
    plain.compiled = False
    pod = PodSpec(cpu_m=4000, memory_mib=8192, gpu=GpuRequest(1, 100, 0, 100))
    boosts = 0
    for i in range(12):
        mask = feasible(pod, view, sched.profile)
        plain.learn("p0", pod)  # one pod learned: later ones move the weights by the boost alone, not a new mix
        plain.score(pod, view, mask)
        before = compiled._w.copy() if compiled._agg is not None else None
        p = place_pod(pod, view, sched.profile, key="p0")
        compiled.score(pod, view, mask)
        boosts += before is not None and before.shape == compiled._w.shape and not np.array_equal(before, compiled._w)
        priced_afresh(compiled)
        priced_afresh(plain)
        assert p is not None
        view.state.assign(f"p{i}", p)
    assert boosts >= 2, boosts
