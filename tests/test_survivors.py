"""Tests added for mutants that bench/mutate.py found surviving (docs/testing.md lists them): each pins a
behaviour that no other test checked."""

from __future__ import annotations

import numpy as np

from conftest import fraction, gpu_node, job, starving_gang_beside_a_stream, whole
from fairgpu.catalog import load_profile
from fairgpu.framework.placement import filter_breakdown, place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuDevice, NodeSpec, PodSpec, QueueSpec, QueueTree


def test_a_gang_that_fits_but_for_a_reservation_is_told_so_not_that_it_is_incomplete():
    s = starving_gang_beside_a_stream()
    s.remove("s0")
    s.remove("s1")  # two GPUs free, both held for the starving gang
    s.submit(job("late", "stream", whole(1), pods=2, t=2))
    s.cycle(2)
    assert "late" in s.pending
    assert s.explain("late", 2).reasons == ["reserved for another workload: nodes held for gang until t=1m"]


def test_a_share_of_a_gpu_is_explained_by_the_cores_its_healthy_gpus_lack():
    """One GPU is unhealthy, the other has 10 cores left: a pod asking for 50 cores is refused for cores
    (an unhealthy GPU is not a candidate, whatever it has free)."""
    devices = (GpuDevice("A100-80GB", 81920, "GPU-0"), GpuDevice("A100-80GB", 81920, "GPU-1", healthy=False))
    node = NodeSpec("n0", 64_000, 1 << 20, devices)
    profile = load_profile("fairgpu")
    view = Scheduler([node], QueueTree([QueueSpec("q")]), profile).view
    taken = place_pod(fraction(90, 1000), view, profile)
    assert taken is not None and taken.slots == (0,)
    view.state.assign("taken", taken)
    assert filter_breakdown(fraction(50, 1000), view, profile) == (0, {"insufficient GPU cores": 1})


def test_best_fit_weighs_cpu_and_gpus_left_each_over_the_largest_node():
    """n0 keeps half its CPU but no GPU after the pod; n1 keeps little CPU but most of its GPUs. Over the
    largest node's capacity, n0 is left with less (0.25 against 0.49): BestFit picks it."""
    from fairgpu.catalog import profile_from_dict

    nodes = [gpu_node("n0"), gpu_node("n1")]
    best_fit = profile_from_dict(
        {"name": "t", "queueSort": "PrioritySort", "filter": ["Resources"], "score": ["BestFit"]}
    )
    view = Scheduler(nodes, QueueTree([QueueSpec("q")]), best_fit).view
    for key, pod, avoid in (("g", whole(7, cpu_m=64_000), [False, True]), ("c", PodSpec(cpu_m=113_000), [True, False])):
        p = place_pod(pod, view, best_fit, np.array(avoid))
        assert p is not None
        view.state.assign(key, p)
    assert place_pod(whole(1), view, best_fit).node == 0


def _fragmentation(**args: object):
    from fairgpu.catalog import profile_from_dict

    score = [{"name": "Fragmentation", "args": args}]
    return profile_from_dict({"name": "t", "queueSort": "PrioritySort", "filter": ["Resources"], "score": score})


def _fill(view, profile, pods: list[PodSpec], node: int) -> None:
    """Place `pods` on `node` (the others avoided), as earlier cycles would have."""
    avoid = np.ones(view.state.num_nodes, dtype=bool)
    avoid[node] = False
    for i, pod in enumerate(pods):
        p = place_pod(pod, view, profile, avoid)
        assert p is not None and p.node == node
        view.state.assign(f"fill{node}-{i}", p)


def test_fgd_puts_a_cpu_only_pod_where_it_strands_no_gpu():
    """y has one GPU left and 12 cores, just enough for the mix's 1-GPU, 10-core pods; x is idle with 128
    cores. A CPU-only pod on y would leave y's last GPU without the CPU to use it, on x it strands nothing:
    FGD puts it on x, though y comes first and an 8-GPU pod is in the mix too (x alone can take one)."""
    profile = _fragmentation()
    view = Scheduler([gpu_node("y", cpu_m=82_000), gpu_node("x")], QueueTree([QueueSpec("q")]), profile).view
    _fill(view, profile, [whole(1, cpu_m=10_000)] * 7, node=0)
    assert place_pod(whole(8), view, profile).node == 1  # an 8-GPU pod seen (waiting), so part of the mix
    assert place_pod(PodSpec(cpu_m=4000), view, profile).node == 1


def test_cpu_balance_sends_a_cpu_light_gpu_pod_where_cpu_is_short():
    """The mix so far: 1-GPU pods with 16 cores each. p has 8 idle GPUs but 32 cores, too few to feed them;
    q and r have CPU to spare. With the cpu_balance term, a 1-GPU pod needing 1 core goes to p (where it
    uses a GPU that would idle anyway for want of CPU) and q's CPU stays for CPU-hungry pods; q comes first
    in node order, and FGD's own measure sees no difference between them."""
    profile = _fragmentation(cpu_balance=1.0)
    nodes = [gpu_node("q"), gpu_node("p", cpu_m=32_000), gpu_node("r")]
    view = Scheduler(nodes, QueueTree([QueueSpec("q")]), profile).view
    _fill(view, profile, [whole(1, cpu_m=16_000)] * 4, node=2)
    assert place_pod(whole(1, cpu_m=1000), view, profile).node == 1
