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


# -- plugins/fragmentation_kernels.py: cpu_balance's starved-capacity term, compiled ---------------------------


def _fragmentation_profile(args: dict[str, object]):
    from fairgpu.catalog import profile_from_dict

    score = [{"name": "Fragmentation", "args": args}]  # compiled, as by default
    return profile_from_dict({"name": "t", "queueSort": "PrioritySort", "filter": ["Resources"], "score": score})


def _place_beside(nodes, fill: list[PodSpec], on: int, pod: PodSpec, args=None) -> int:
    """Place `fill` on node `on` (as earlier cycles would have), then `pod` where a Fragmentation profile with
    `args` (cpu_balance 1 unless given) puts it."""
    profile = _fragmentation_profile({"cpu_balance": 1.0} if args is None else args)
    view = Scheduler(nodes, QueueTree([QueueSpec("q")]), profile).view
    avoid = np.ones(len(nodes), dtype=bool)
    avoid[on] = False
    for i, f in enumerate(fill):
        p = place_pod(f, view, profile, avoid, key=f"fill{i}")
        assert p is not None and p.node == on
        view.state.assign(f"fill{i}", p)
    p = place_pod(pod, view, profile, key="pod")
    assert p is not None
    return p.node


def _whole(cpu_m: int) -> PodSpec:
    return PodSpec(cpu_m=cpu_m, memory_mib=1024, gpu=GpuRequest(1, 100, 0, 100))


def test_cpu_balance_weighs_cpu_a_cpu_light_mix_needs():
    """The mix: four 1-GPU pods asking 80 m CPU each and the one placed, asking 10 m: 0.66 m per GPU percent
    (CPU-light inference, say). p has 8 idle GPUs but 320 m, CPU for under 5 of them; q and r have CPU to
    spare. The pod goes to p, where it uses a GPU that would idle for want of CPU, though q comes first and
    FGD's own measure sees no difference: cpu_balance prices starved GPUs however little CPU the mix needs."""
    nodes = [gpu_node("q"), gpu_node("p", cpu_m=320), gpu_node("r")]
    assert _place_beside(nodes, [_whole(80)] * 4, 2, _whole(10)) == 1


def test_cpu_balance_counts_a_node_short_of_cpu_for_under_one_percent_of_a_gpu():
    """The mix: four 1-GPU pods asking 16 cores each and the one placed, asking none: 128 m per GPU percent.
    p's 8 idle GPUs lack 64 m of CPU, half a percent of one GPU it cannot feed; q and r have CPU to spare. The
    pod goes to p, where it takes a GPU the CPU could not fully feed, not to q, which comes first: starved
    capacity counts from the first fraction of a percent, not from a whole one."""
    nodes = [gpu_node("q"), gpu_node("p", cpu_m=8 * 100 * 128 - 64), gpu_node("r")]
    assert _place_beside(nodes, [_whole(16_000)] * 4, 2, _whole(0)) == 1


def test_fragmentation_without_cpu_balance_is_fgds_measure_alone():
    """cpu_balance is off unless a profile sets it (docs/profiles.md: 1 in `fairgpu`): the CPU-short node p
    that cpu_balance prefers (test_survivors::test_cpu_balance_sends_a_cpu_light_gpu_pod_where_cpu_is_short) is
    no better to FGD's own measure, so the pod goes to q, first in node order."""
    nodes = [gpu_node("q"), gpu_node("p", cpu_m=32_000), gpu_node("r")]
    assert _place_beside(nodes, [_whole(16_000)] * 4, 2, _whole(1000), args={}) == 0
    assert _place_beside(nodes, [_whole(16_000)] * 4, 2, _whole(1000)) == 1
