"""Pods with several GPU containers are scored and preempted for by their whole GPU request (issue 12), not by
their first container's: Fragmentation learns and scores the whole request, and preemption ranks nodes by the
victims on every card the pod's containers take."""

from __future__ import annotations

import numpy as np

from conftest import gpu_node, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.interfaces import FitMask
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuRequest, PodSpec, QueueSpec, QueueTree, Workload
from fairgpu.plugins.fragmentation import Fragmentation

CARD = GpuRequest(1, 100, 0, 100)


def _two_containers() -> PodSpec:
    return PodSpec(cpu_m=1000, memory_mib=1024, gpu=CARD, more_gpus=(CARD,))


def test_whole_request_sums_cards_and_keeps_cores_per_card() -> None:
    assert _two_containers().whole_gpu == GpuRequest(2, 100, 0, 100)
    mixed = PodSpec(gpu=GpuRequest(1, 100, 0, 100), more_gpus=(GpuRequest(2, 25, 3000),))
    assert mixed.whole_gpu == GpuRequest(3, 50, 3000, 100)  # 150 cores over 3 cards; not exclusive
    assert not mixed.whole_gpu.exclusive and mixed.as_one_container().more_gpus == ()
    one = whole(1)
    assert one.as_one_container() is one


def test_fragmentation_scores_two_gpu_containers_as_two_gpus() -> None:
    """Nodes with 2, 3 and 4 free GPUs, a mix of 2-GPU pods: a 2-GPU pod fragments nothing on the 2- and 4-GPU
    nodes and strands one GPU on the 3-GPU node; a 1-GPU pod the other way round. A pod of two 1-GPU
    containers scores as the 2-GPU pod (the old plugin read its first container: the 1-GPU pod's scores)."""
    sched = Scheduler([gpu_node(f"n{i}", 4) for i in range(3)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    for node, busy in ((0, 2), (1, 1)):
        for s in range(busy):
            sched.state.assign(f"busy{node}-{s}", sched.state.placement_for(whole(1), node, (s,)))
    mask = FitMask(nodes=np.ones(3, dtype=bool), slots=sched.state.gpu_idle.copy())

    def scores(pod: PodSpec) -> np.ndarray:
        frag = Fragmentation()
        for i in range(3):
            frag.learn(f"mix-{i}", whole(2))
        frag.learn("pod", pod)
        frag.generation(pod, sched.view)
        return frag.score(pod, sched.view, mask)

    two, one, both = scores(whole(2)), scores(whole(1)), scores(_two_containers())
    assert two[0] == two[2] > two[1] and one[1] == one[2] > one[0]
    assert np.allclose(both, two)


def test_preemption_for_two_gpu_containers_counts_every_card() -> None:
    """Two 2-GPU nodes of borrowed 1-GPU pods: on n0 one just started (cheap) beside one running long (dear),
    on n1 two mid-aged ones. A guaranteed pod of two 1-GPU containers needs a whole node: the two mid-aged
    pods are the cheaper pair. Ranking nodes by its first container alone (one card) chose n0 for its cheap
    pod, then had to evict the dear one too."""
    guaranteed = QueueSpec("a", guaranteed=r.quota_vector({"nvidia.com/gpu": 2}, default=np.inf))
    sched = Scheduler([gpu_node("n0", 2), gpu_node("n1", 2)], QueueTree([guaranteed, QueueSpec("b")]),
                      load_profile("fairgpu"))  # fmt: skip
    for name, node, slot, started in (("cheap", 0, 0, 90.0), ("dear", 0, 1, 0.0), ("mid0", 1, 0, 60.0),
                                      ("mid1", 1, 1, 60.0)):  # fmt: skip
        sched.adopt(Workload(name, "b", (whole(1),)), [sched.state.placement_for(whole(1), node, (slot,))], started)
    sched.submit(Workload("a0", "a", (_two_containers(),), duration=3600.0))
    evicted = sched.cycle(100.0).evictions
    assert sorted(e.workload for e in evicted) == ["mid0", "mid1"]
    for e in evicted:
        sched.remove(e.workload)
    res = sched.cycle(101.0)
    assert res.started == ["a0"] and res.bound[0].placement.node == 1
    assert sorted(res.bound[0].placement.slots) == [0, 1] and res.bound[0].placement.segments == (1, 1)


def test_preemption_for_containers_sharing_a_card_evicts_the_pod_that_lost_least_work() -> None:
    """Three 2-GPU nodes. Queue c, within its guarantee, holds half of each card of n0 and all of n1's second
    card; queue b (no guarantee) a half-card pod on n0 started 6 s ago, a whole-card pod on n1 started 2.5 s ago
    and both of n2's cards since long before. Queue a (guaranteed 2 GPUs) waits with two workloads, so b is
    well above its share. a's first, a pod of two half-card containers, reclaims: on n0 its containers would
    take a card each, on n1 they share the first. The whole-card pod lost 2.5 GPU-s of work, the half-card one
    3: the whole-card pod is evicted for it, although on its node the pod takes one card and on n0 two (a node
    is ranked by the victims on the cards the pod takes, not by how many cards those are)."""
    half = GpuRequest(1, 50, 0, 50)
    gpus = {n: r.quota_vector({"nvidia.com/gpu": n}, default=np.inf) for n in (2, 3)}
    queues = QueueTree([QueueSpec("a", guaranteed=gpus[2]), QueueSpec("b"), QueueSpec("c", guaranteed=gpus[3])])
    sched = Scheduler([gpu_node(f"n{i}", 2) for i in range(3)], queues, load_profile("fairgpu"))
    shared = PodSpec(cpu_m=1000, memory_mib=1024, gpu=half)
    for name, queue, pod, node, slots, started in (
        ("x", "c", shared, 0, (0,), 0.0),
        ("y", "c", shared, 0, (1,), 0.0),
        ("z", "c", whole(1), 1, (1,), 0.0),
        ("half-old", "b", shared, 0, (0,), 94.0),
        ("whole-young", "b", whole(1), 1, (0,), 97.5),
        ("two-old", "b", whole(2), 2, (0, 1), 0.0),
    ):
        sched.adopt(Workload(name, queue, (pod,)), [sched.state.placement_for(pod, node, slots)], started)
    sched.submit(Workload("a0", "a", (PodSpec(cpu_m=1000, memory_mib=1024, gpu=half, more_gpus=(half,)),)))
    sched.submit(Workload("a1", "a", (whole(2),), submit_time=1.0))
    evicted = sched.cycle(100.0).evictions
    assert [e.workload for e in evicted if e.reason.endswith(" a0")] == ["whole-young"]
