"""HAMi's GPU policies beyond binpack/spread (issue 12): `topology-aware` with the node's pair scores
(hami.io/node-nvidia-score), comma chains (`numa,binpack`, `mutex,topology-aware`), and the per-pod card score
weights (hami.io/device-scoring-weights), each as HAMi v2.10's Fit and card order decide; engine cases, the
Kubernetes readers, then the live path through the fake kubelet's Allocate double."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from fairgpu.catalog import load_profile
from fairgpu.errors import FormatError
from fairgpu.framework.placement import place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.k8s import hami
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.parsed import ParsedNodes
from fairgpu.k8s.port import NODES, PODS, QUEUES
from fairgpu.k8s.translate import node_spec, pod_info
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree
from fake_kubelet import GPU_MEM, SPLIT, FakeNodes
from test_live_scheduling import stop, until

MIB = 8192
# g0–g3 NVLinked as 0↔3 (300) and 1↔2 (100), every other pair over PCIe (10)
LINKS = ((0, 10, 10, 300), (10, 0, 100, 10), (10, 100, 0, 10), (300, 10, 10, 0))


def _engine(pairs: tuple = LINKS, numa: tuple[int, ...] = (0, 0, 0, 0)) -> Scheduler:
    gpus = tuple(GpuDevice("NVIDIA A100", MIB, f"g{j}", numa=n) for j, n in enumerate(numa))
    node = NodeSpec("n", 64000, 256000, gpus, pair_scores=pairs)
    return Scheduler([node], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))


def _pod(count: int, policy: str = "", **kw) -> PodSpec:
    return PodSpec(gpu=GpuRequest(count, 10, 1000), gpu_policy=policy, **kw)


def _cards(sched: Scheduler, pod: PodSpec) -> tuple[int, ...]:
    p = place_pod(pod, sched.view, sched.profile)
    assert p is not None
    return p.slots


def test_topology_aware_takes_the_best_linked_cards_and_the_worst_linked_single_card() -> None:
    """Two cards: the NVLinked pair with the highest summed score (g0+g3), not the first two of HAMi's walk (g3,
    g2); one card: the one least linked to the other fitting cards (g1 and g2 tie at 120: the first in the walk,
    g2), keeping the NVLinked pair whole; four of four fitting: all of them. Without pair scores HAMi keeps
    its walk order, as without the policy."""
    sched = _engine()
    assert sorted(_cards(sched, _pod(2, "topology-aware"))) == [0, 3]
    assert sorted(_cards(sched, _pod(2, "spread"))) == [2, 3]
    assert _cards(sched, _pod(1, "topology-aware")) == (2,)
    assert _cards(sched, _pod(1, "spread")) == (3,)
    assert sorted(_cards(sched, _pod(4, "topology-aware"))) == [0, 1, 2, 3]
    flat = _engine(pairs=())
    assert _cards(flat, _pod(2, "topology-aware")) == _cards(flat, _pod(2, "spread"))
    # only fitting cards compete: with g0 full, g1+g2 (100) beat any pair with g3 (10)
    sched.state.assign("full", sched.state.placement_for(PodSpec(gpu=GpuRequest(1, 100, 0)), 0, (0,)))
    assert sorted(_cards(sched, _pod(2, "topology-aware"))) == [1, 2]


def test_topology_aware_in_a_chain_with_mutex_and_numa_bind() -> None:
    """`mutex,topology-aware` takes only idle cards and among them the best pair; with numa-bind, HAMi's walk
    starts afresh at every NUMA change and topology-aware never stops early, so only the last NUMA group it
    walks competes (here NUMA 0: g0+g1, though g2+g3 on NUMA 1 are linked better)."""
    sched = _engine()
    sched.state.assign("busy", sched.state.placement_for(_pod(1), 0, (3,)))
    assert sorted(_cards(sched, _pod(2, "mutex,topology-aware"))) == [1, 2]
    links = ((0, 5, 0, 0), (5, 0, 0, 0), (0, 0, 0, 400), (0, 0, 400, 0))
    numa = _engine(pairs=links, numa=(0, 0, 1, 1))
    assert sorted(_cards(numa, _pod(2, "topology-aware", numa_bind=True))) == [0, 1]
    assert sorted(_cards(numa, _pod(2, "topology-aware"))) == [2, 3]


def test_policy_chains_order_cards_as_hamis_less() -> None:
    """g0 (NUMA 0) half used, g1 (NUMA 0) and g2, g3 (NUMA 1) idle. `binpack` takes the fullest card, g0;
    `numa,binpack` walks NUMA 1 first (highest NUMA last in HAMi's sorted list) and takes g3; bare `numa` is a
    chain too: NUMA 1, then the higher index; `spread` takes an idle card."""
    sched = _engine(numa=(0, 0, 1, 1))
    sched.state.assign("half", sched.state.placement_for(PodSpec(gpu=GpuRequest(1, 50, 4000)), 0, (0,)))
    assert _cards(sched, _pod(1, "binpack")) == (0,)
    assert _cards(sched, _pod(1, "numa,binpack")) == (3,)
    assert _cards(sched, _pod(1, "numa")) == (3,)
    assert _cards(sched, _pod(1, "binpack,numa")) == (0,)
    assert _cards(sched, _pod(1, "spread")) in ((1,), (2,), (3,))


def test_scoring_weights_change_the_card_binpack_prefers() -> None:
    """HAMi's TestComputeScoreWithResourceWeights shape: card a has cores used (90) and little memory, card b many
    tasks and more memory. Under binpack, equal weights pick a; memory ×3 picks b; core ×3 picks a again."""
    gpus = (GpuDevice("NVIDIA A100", 100, "a", split=10), GpuDevice("NVIDIA A100", 100, "b", split=10))
    sched = Scheduler([NodeSpec("n", 64000, 256000, gpus)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    st = sched.state
    st.assign("a", st.placement_for(PodSpec(gpu=GpuRequest(1, 90, 10)), 0, (0,)))
    for i in range(7):
        st.assign(f"b{i}", st.placement_for(PodSpec(gpu=GpuRequest(1, 1 + (i < 3), 2 + (i < 6))), 0, (1,)))
    assert (st.gpu_cores_free[0, 1], st.gpu_mem_free[0, 1]) == (90, 80)  # 10 cores, 20 MiB, 7 tasks
    pod = PodSpec(gpu=GpuRequest(1, 0, 1), gpu_policy="binpack")
    assert _cards(sched, pod) == (0,)
    assert _cards(sched, PodSpec(gpu=pod.gpu, gpu_policy="binpack", gpu_weights=(1, 1, 3))) == (1,)
    assert _cards(sched, PodSpec(gpu=pod.gpu, gpu_policy="binpack", gpu_weights=(1, 3, 1))) == (0,)
    # weights alone put the pod in HAMi's order (default spread: the emptiest card by the weighted score)
    assert _cards(sched, PodSpec(gpu=pod.gpu, gpu_weights=(0, 0, 1))) == (0,)
    assert _cards(sched, PodSpec(gpu=pod.gpu, gpu_weights=(0, 1, 0))) == (1,)


def _obj(annotations: dict) -> dict:
    c = {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    return {"metadata": {"name": "p", "namespace": "n", "annotations": annotations}, "spec": {"containers": [c]}}


def test_kubernetes_readers_of_policy_weights_and_pair_scores() -> None:
    """The pod's chain is kept as written and its weights read as HAMi's ParseDeviceScoringWeights; a bad value
    is the pod's problem, named. The node's pair scores come from hami.io/node-nvidia-score by UUID (a card
    HAMi registered no score for scores 0); an annotation Go's json.Unmarshal refuses leaves the node out."""
    spec = pod_info(
        _obj({hami.GPU_POLICY: "numa,topology-aware", hami.SCORING_WEIGHTS: " memory = 3, slot = 1, core = 0 "})
    ).spec
    assert (spec.gpu_policy, spec.gpu_topology, spec.gpu_weights) == ("numa,topology-aware", True, (1, 0, 3))
    for bad, why in (("slot=1,memory=3", "expected slot, core, and memory weights"),
                     ("slot=1,core=-1,memory=3", '"core" weight must not be negative'),
                     ("slot=0,core=0,memory=0", "at least one weight must be positive")):  # fmt: skip
        problem = pod_info(_obj({hami.SCORING_WEIGHTS: bad})).problem
        assert problem is not None and hami.SCORING_WEIGHTS in problem and why in problem
    devices = [hami.RegisteredGpu(f"GPU-{j}", 10, 8192, 100, "NVIDIA A100", 0, True, j) for j in range(3)]
    scores = [{"uuid": "GPU-0", "score": {"GPU-1": 200, "GPU-2": 10}}, {"uuid": "GPU-1", "score": {"GPU-0": 200}}]
    node = {
        "metadata": {"name": "n", "annotations": {hami.NODE_REGISTER: hami.encode_register(devices),
                                                  hami.NODE_SCORE: json.dumps(scores)}},
        "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "nvidia.com/gpu": "30"}},
    }  # fmt: skip
    assert node_spec(node).pair_scores == ((0, 200, 10), (200, 0, 0), (0, 0, 0))
    for bad in ('{"uuid": "GPU-0"}', '[{"uuid": "GPU-0", "score": {"GPU-1": 1.5}}]', "[{"):
        node["metadata"]["annotations"][hami.NODE_SCORE] = bad
        with pytest.raises(FormatError, match=hami.NODE_SCORE):
            node_spec(node)
        assert ParsedNodes().read({"n": node}) == []
    with pytest.raises(ValueError, match="pair_scores"):
        NodeSpec("x", 1, 1, tuple(GpuDevice("m", 1) for _ in range(2)), pair_scores=((0, 1),))


def test_live_topology_aware_pod_gets_the_nvlinked_pair(fake_api, tmp_path) -> None:
    """A node of four cards registering pair scores (g1↔g2 NVLinked): a topology-aware 2-GPU pod bound through
    the controller gets GPU-1 and GPU-2 in its allocation annotation, served by the Allocate double; a pod with
    a bad scoring-weights annotation is never bound."""

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        devices = [hami.RegisteredGpu(f"GPU-{j}", SPLIT, GPU_MEM, 100, "NVIDIA A100-SXM4-80GB", 0, True, j)
                   for j in range(4)]  # fmt: skip
        link = {(a, b): 300 if {a, b} == {1, 2} else 20 for a in range(4) for b in range(4) if a != b}
        scores = [
            {"uuid": f"GPU-{a}", "score": {f"GPU-{b}": s for (x, b), s in link.items() if x == a}} for a in range(4)
        ]
        await port.create(NODES, {
            "metadata": {"name": "nv", "annotations": {hami.NODE_REGISTER: hami.encode_register(devices),
                                                       hami.NODE_SCORE: json.dumps(scores)}},
            "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": str(4 * SPLIT)}},
        })  # fmt: skip
        await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
        limits = {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "20", "nvidia.com/gpumem": "1000"}
        for name, ann in (("topo", {hami.GPU_POLICY: "topology-aware"}), ("bad", {hami.SCORING_WEIGHTS: "slot=1"})):
            await port.create(PODS, {
                "metadata": {"name": name, "namespace": "a", "annotations": ann},
                "spec": {"schedulerName": "fairgpu",
                         "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]},
            }, "a")  # fmt: skip
        kubelet_nodes = FakeNodes(port)
        kubelet = asyncio.create_task(kubelet_nodes.run())
        run = asyncio.create_task(Controller(port, load_profile("fairgpu")).run())
        try:
            await until(lambda: "a/topo" in kubelet_nodes.allocations, 30, "HAMi's Allocate for the topology pod")
            assert not kubelet_nodes.violations, kubelet_nodes.violations
            topo = await port.get(PODS, "topo", "a")
            cards = hami.decode_devices(topo["metadata"]["annotations"][hami.ALLOCATED])
            assert sorted(d.uuid for d in cards[0]) == ["GPU-1", "GPU-2"]
            bad = await port.get(PODS, "bad", "a")
            assert not bad["spec"].get("nodeName")
        finally:
            await stop(port, run, kubelet)

    asyncio.run(asyncio.wait_for(go(), 60))


def test_combinations_are_bounded_in_memory_for_large_nodes() -> None:
    """Sixteen cards, eight wanted, every pair scored: the best combination (the eight cards of one NVLink
    island scoring 50 among themselves) is found on many nodes at once."""
    island = np.where((np.arange(16)[:, None] % 2) == (np.arange(16)[None, :] % 2), 50, 1)
    np.fill_diagonal(island, 0)
    pairs = tuple(tuple(int(x) for x in row) for row in island)
    gpus = tuple(GpuDevice("NVIDIA H100", MIB, f"g{j}") for j in range(16))
    nodes = [NodeSpec(f"n{i}", 64000, 256000, gpus, pair_scores=pairs) for i in range(40)]
    sched = Scheduler(nodes, QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    cards = _cards(sched, _pod(8, "topology-aware"))
    assert len({c % 2 for c in cards}) == 1


def test_topology_aware_single_card_weighs_links_to_fitting_cards_only() -> None:
    """g0 full: of g1, g2, g3 the worst linked to the other fitting cards is g3 (10 + 10, against 110 for g1
    and g2); counting g0 too (300 to g3) would make g1 or g2 the worst instead."""
    sched = _engine()
    sched.state.assign("full", sched.state.placement_for(PodSpec(gpu=GpuRequest(1, 100, 0)), 0, (0,)))
    assert _cards(sched, _pod(1, "topology-aware")) == (3,)


def test_topology_aware_on_one_numa_node_with_numa_bind_may_take_every_card() -> None:
    """numa-bind with every card on NUMA 0: the last NUMA run of HAMi's walk is the whole walk, so a 4-card
    topology-aware container takes all four."""
    assert sorted(_cards(_engine(), _pod(4, "topology-aware", numa_bind=True))) == [0, 1, 2, 3]


def test_topology_aware_cards_on_one_node_do_not_depend_on_how_many_fit_on_another() -> None:
    """Two nodes with the same links; on n1 g0 is full. A 2-card pod kept off n0 (say n0 is held for a
    reservation) gets n1's best linked fitting pair g1+g2, though n0, where all four fit, was filtered with it;
    and a node where fewer cards fit than asked is simply not a candidate."""
    gpus = tuple(GpuDevice("NVIDIA A100", MIB, f"g{j}") for j in range(4))
    nodes = [NodeSpec(f"n{i}", 64000, 256000, gpus, pair_scores=LINKS) for i in range(2)]
    sched = Scheduler(nodes, QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    sched.state.assign("full", sched.state.placement_for(PodSpec(gpu=GpuRequest(1, 100, 0)), 1, (0,)))
    p = place_pod(_pod(2, "topology-aware"), sched.view, sched.profile, exclude=np.array([True, False]))
    assert p is not None and (p.node, sorted(p.slots)) == (1, [1, 2])
    for j in (1, 2):
        sched.state.assign(f"full{j}", sched.state.placement_for(PodSpec(gpu=GpuRequest(1, 100, 0)), 1, (j,)))
    assert place_pod(_pod(2, "topology-aware"), sched.view, sched.profile, exclude=np.array([True, False])) is None
    alone = _engine()  # and when no node has enough: nothing to choose among, no error
    for j in (0, 1, 2):
        alone.state.assign(f"full{j}", alone.state.placement_for(PodSpec(gpu=GpuRequest(1, 100, 0)), 0, (j,)))
    assert place_pod(_pod(2, "topology-aware"), alone.view, alone.profile) is None


def test_numa_bind_topology_aware_walks_only_the_cards_of_the_allowed_type() -> None:
    """g0, g1 (NUMA 0) are T4s, g2, g3 (NUMA 1) A100s; a NUMA-bound topology-aware pod for A100s only: HAMi's
    walk restarts at NUMA changes among cards that pass its type check, so the T4s' NUMA node is no run of it
    and the pod gets g2+g3."""
    gpus = tuple(GpuDevice(m, MIB, f"g{j}", numa=j // 2) for j, m in enumerate(("T4", "T4", "A100", "A100")))
    node = NodeSpec("n", 64000, 256000, gpus, pair_scores=LINKS)
    sched = Scheduler([node], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    assert sorted(_cards(sched, _pod(2, "topology-aware", numa_bind=True, gpu_include=("A100",)))) == [2, 3]
