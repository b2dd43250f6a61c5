"""The learned mix refreshes its weights exactly when the counts grew by a quarter, though it sums them only
now and then (ShapeMix.running): the same refreshes, at the same arrivals, as summing every time."""

from __future__ import annotations

import numpy as np

from fairgpu.model.pod import GpuRequest, PodSpec
from fairgpu.plugins.fragmentation_mix import _EXACT_EVERY, ShapeMix, shape_key


def arrivals(seed: int, n: int) -> list[PodSpec]:
    """Shared pods of a few shapes (fractions of a GPU, so by demand the counts are inexact floats), whole-GPU
    pods and CPU-only ones."""
    rng = np.random.default_rng(seed)
    pods = []
    for _ in range(n):
        u = rng.random()
        if u < 0.1:
            pods.append(PodSpec(cpu_m=2000, memory_mib=1024))
        elif u < 0.4:
            pods.append(PodSpec(cpu_m=4000, memory_mib=4096, gpu=GpuRequest(int(rng.integers(1, 4)), 100, 0, 100)))
        else:
            pods.append(PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, int(rng.choice([7, 13, 30])), 2048)))
    return pods


def refreshes_as_a_sum_every_time(pods: list[PodSpec]) -> tuple[int, int]:
    """Feeds the pods to a mix by demand and checks each arrival's (added, refreshed) against the rule summed
    every time; returns (refreshes, those by a quarter's growth)."""
    mix = ShapeMix()
    counts: dict[tuple[object, ...], float] = {}
    p_total, refreshes, growths = 0.0, 0, 0
    for i, pod in enumerate(pods):
        added, refreshed = mix.add(pod, memory=True, by_demand=True, max_shapes=512, refresh=i == 0)
        if pod.gpu is None:
            assert not refreshed
            continue
        # the rule summed every time: a new shape, or the counts a quarter above the last refresh's
        key = shape_key(pod, True)
        new = key not in counts
        counts[key] = counts.get(key, 0.0) + pod.gpu.gpu_equivalents()
        total = max(float(np.array(list(counts.values())).sum()), 1e-9)
        due = i == 0 or new or total > p_total * (1 + 1 / 4)
        assert (added, refreshed) == (new, due), i
        if due:
            p_total, refreshes, growths = total, refreshes + 1, growths + (not new and i > 0)
            assert mix.p_total == total
    return refreshes, growths


def test_the_weights_refresh_at_the_arrivals_a_sum_every_time_refreshes_them() -> None:
    refreshes, growths = refreshes_as_a_sum_every_time(arrivals(5, 6000))
    assert refreshes == 6 + growths  # every shape's first pod, and the rest by a quarter's growth
    assert growths > 15


def test_the_weights_refresh_when_the_counts_cross_the_threshold_though_the_running_sum_rounds_below_it() -> None:
    """28 and 65 cores in this order: at the 45th arrival the counts sum to 21.85000000000001, above the
    threshold 21.850000000000005 (a quarter above the last refresh), while the running sum, added up in
    another order, rounds to 21.85, below it: only the exact sum sees the refresh is due."""
    order = "abbbbaaabaabbbbbbbbbbaabaaabaaabaabbbbbabaaab"
    pods = [PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, 28 if c == "a" else 65, 2048)) for c in order]
    mix = ShapeMix()
    for pod in pods[:-1]:
        mix.add(pod, memory=True, by_demand=True, max_shapes=512, refresh=False)
    count = mix.count.copy()
    count[mix.keys[shape_key(pods[-1], True)]] += 0.65
    assert mix.running + 0.65 < mix.p_total * (1 + 1 / 4) < float(count.sum())  # as described
    assert refreshes_as_a_sum_every_time(pods)[1] > 0


def test_the_counts_are_summed_exactly_at_least_every_exact_every_arrivals() -> None:
    """The running sum is trusted for at most _EXACT_EVERY arrivals at a time: one that drifted from the counts
    (its rounding grows with the arrivals since the last exact sum; made large here on purpose) is set right by
    an exact sum within that many arrivals, and the refresh it hid comes then, from the exact counts."""
    mix = ShapeMix()
    pod = PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, 30, 2048))
    assert mix.add(pod, memory=True, by_demand=True, max_shapes=512, refresh=True) == (True, True)
    mix.running = -1e9  # the counts' sum is 0.3: the next arrival is due a refresh (0.6 > 0.3 · 5/4)
    late = next(
        (
            i
            for i in range(1, 2 * _EXACT_EVERY)
            if mix.add(pod, memory=True, by_demand=True, max_shapes=512, refresh=False)[1]
        ),
        None,
    )  # arrivals until the refresh
    assert late is not None and late <= _EXACT_EVERY
    assert mix.p_total == float(mix.count.sum()) and mix.p_total > 0.3 * late
