"""Tests added for mutants of plugins/ that bench/mutate.py found surviving on main 445efb4 (docs/testing.md,
"Session 8"): each pins a behaviour that no test checked."""

from __future__ import annotations

import copy

import numpy as np

from conftest import gpu_node
from fairgpu.catalog import load_profile
from fairgpu.framework.placement import feasible, place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuRequest, PodSpec, QueueSpec, QueueTree
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


def test_compiled_fragmentation_scores_as_its_numpy_path_where_shapes_fit_many_nodes_or_none_and_need_little_cpu():
    """`compiled` changes nothing but speed: the kernels score bit for bit as the NumPy path, here where
    test_evaluations' run does not go. The fairgpu profile (scarce 16, pressure 16, cpu_balance 1) on 40 nodes
    of 2 GPUs: a shape fits on more than twice `scarce` nodes; pods ask 20 m CPU per 30 % of a GPU and 100 m
    per two whole GPUs (under 1 m per GPU percent); then every GPU holds a 30 % pod, so the whole-GPU shape, in the
    mix, has no room anywhere."""
    sched = Scheduler(
        [gpu_node(f"n{i}", gpus=2) for i in range(40)], QueueTree([QueueSpec("q")]), load_profile("fairgpu")
    )
    view = sched.view
    compiled = next(p for p, _ in sched.profile.score if isinstance(p, Fragmentation))
    plain = copy.deepcopy(compiled)
    plain.compiled = False
    small = PodSpec(cpu_m=20, memory_mib=512, gpu=GpuRequest(1, 30, 1024))
    big = PodSpec(cpu_m=100, memory_mib=512, gpu=GpuRequest(2, 100, 0, 100))

    def compare(pod: PodSpec, key: str) -> None:
        mask = feasible(pod, view, sched.profile)
        place_pod(pod, view, sched.profile, key=key)  # the compiled plugin learns the pod here
        plain.learn(key, pod)
        plain.generation(pod, view)
        a, b = compiled.score(pod, view, mask), plain.score(pod, view, mask)
        assert np.array_equal(a, b), (key, a, b)
        assert np.array_equal(compiled._w, plain._w), (key, compiled._w, plain._w)

    for i, pod in enumerate([small, big, small, big]):
        compare(pod, f"p{i}")
    for n in range(40):
        for g in range(2):
            view.state.assign(f"fill-{n}-{g}", view.state.placement_for(small, n, (g,)))
    assert not feasible(big, view, sched.profile).nodes.any()
    for i in range(3):
        compare(small, f"q{i}")
