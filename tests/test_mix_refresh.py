"""The learned mix refreshes its weights exactly when the counts grew by a quarter, though it sums them only
now and then (ShapeMix.running): the same refreshes, at the same arrivals, as summing every time."""

from __future__ import annotations

import numpy as np

from fairgpu.model.pod import GpuRequest, PodSpec
from fairgpu.plugins.fragmentation_mix import ShapeMix, shape_key


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


def test_the_weights_refresh_at_the_arrivals_a_sum_every_time_refreshes_them() -> None:
    pods = arrivals(5, 6000)
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
    assert refreshes == 6 + growths  # every shape's first pod, and the rest by a quarter's growth
    assert growths > 15
