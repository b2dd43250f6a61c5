"""Tests added for mutants of plugins/ that bench/mutate.py found surviving on main 445efb4 (docs/testing.md,
"Session 8"): each pins a behaviour that no test checked."""

from __future__ import annotations

from fairgpu.model import PodSpec
from fairgpu.plugins.fragmentation import Fragmentation

# -- plugins/fragmentation.py: the pods counted into the mix ----------------------------------------------------


def test_fragmentation_counts_a_retried_pod_once_among_the_65536_pods_tried_most_recently():
    """A pod is counted into the mix once however often it is tried, as long as it is among the last 65,536
    pods tried (docs/performance.md; memory stays bounded in a controller that runs for months): a retry makes
    it the most recent, and past the bound the pod tried longest ago is forgotten and counts again when it
    comes back. CPU-only pods of 1 m each, so the mix's CPU-only total counts arrivals."""
    f = Fragmentation(compiled=False)
    pod = PodSpec(cpu_m=1, memory_mib=0)
    bound = 65_536
    for i in range(bound):
        f.learn(f"p{i}", pod)
    f.learn("p0", pod)  # a retry within the bound: not counted; p0 is now the most recent, p1 the oldest
    assert f._mix.cpu_only == bound
    f.learn("new", pod)  # one arrival past the bound: p1 is forgotten, not p0 nor the newcomer
    f.learn("new", pod)
    f.learn("p0", pod)
    assert f._mix.cpu_only == bound + 1
    f.learn("p1", pod)  # forgotten: it arrives again
    assert f._mix.cpu_only == bound + 2
