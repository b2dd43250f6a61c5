"""The FGD paper's baselines as `fairgpu fill` runs them (sim/fill.py's profiles): each scores nodes as the
FGD authors' simulator does, in integer scores 0..100 whose ties go to one seeded order of the nodes. A wrong
baseline moves every comparison of fairgpu against it, so the scores are checked against hand-computed
numbers on small clusters where every term of a formula changes the answer."""

from __future__ import annotations

import pytest

from conftest import fraction, gpu_node, whole
from fairgpu.catalog import profile_from_dict
from fairgpu.errors import ProfileError
from fairgpu.framework.placement import feasible, place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree
from fairgpu.sim.fill import policy_profile


def _view(nodes: list[NodeSpec], policy: str = "best-fit", seed: int = 0):
    profile = policy_profile(policy, seed)
    return Scheduler(nodes, QueueTree([QueueSpec("fill")]), profile).view, profile


def _run(view, key: str, pod: PodSpec, node: int, slots: tuple[int, ...]) -> None:
    view.state.assign(key, view.state.placement_for(pod, node, slots))


def _scores(profile, pod: PodSpec, view) -> list[float]:
    """The policy's own score (its first score plugin, before the tie-break) of every node."""
    plugin = profile.score[0][0]
    return plugin.score(pod, view, feasible(pod, view, profile)).tolist()


def _three_nodes():
    """big: 8 idle GPUs, 100 cores (the largest node in both: the scores divide by 100,000 m and 800 %);
    mid: 4 GPUs, 60 cores, 2 whole GPUs and 20 cores taken (200 % and 40,000 m free);
    small: 2 GPUs, 40 cores, 30 % of a GPU and 10 cores taken (170 % and 30,000 m free)."""
    nodes = [
        gpu_node("big", gpus=8, cpu_m=100_000),
        gpu_node("mid", gpus=4, cpu_m=60_000),
        gpu_node("small", gpus=2, cpu_m=40_000),
    ]
    return nodes


def _load(view) -> None:
    _run(view, "mid-job", whole(2, cpu_m=20_000), 1, (0, 1))
    _run(view, "small-job", PodSpec(cpu_m=10_000, memory_mib=512, gpu=GpuRequest(1, 30, 1024)), 2, (0,))


# The pod every score below is for: half a GPU and 10 cores (0.1 of the largest node's CPU, 50/800 of its GPU).
HALF = PodSpec(cpu_m=10_000, memory_mib=1024, gpu=GpuRequest(1, 50, 1024))


def test_best_fit_scores_the_cpu_and_gpu_left_as_the_fgd_simulator_does():
    """floor(100 · (1 − ½·(CPU free − request)/max CPU − ½·(GPU free − request)/max GPU)):
    big 1 − ½·0.9 − ½·750/800 = 0.08125 → 8; mid 1 − ½·0.3 − ½·150/800 = 0.75625 → 75;
    small 1 − ½·0.2 − ½·120/800 = 0.825 → 82. BestFit takes small, the node it leaves fullest."""
    view, profile = _view(_three_nodes(), "best-fit")
    _load(view)
    assert _scores(profile, HALF, view) == [8.0, 75.0, 82.0]
    assert place_pod(HALF, view, profile).node == 2


def test_dot_product_scores_the_alignment_of_free_and_requested_as_the_fgd_simulator_does():
    """Free (CPU, GPU) and the request (0.1, 0.0625), each over the largest node's; score floor(100 · (1 − dot/2)):
    big (1, 1)·(0.1, 0.0625) = 0.1625 → 91; mid (0.4, 0.25) → 0.055625 → 97; small (0.3, 0.2125) → 0.04328… → 97.
    mid and small tie, so the seeded tie-break decides between them, never big."""
    view, profile = _view(_three_nodes(), "dotprod")
    _load(view)
    assert _scores(profile, HALF, view) == [91.0, 97.0, 97.0]
    picked = set()
    for seed in range(8):
        view, profile = _view(_three_nodes(), "dotprod", seed)
        _load(view)
        picked.add(place_pod(HALF, view, profile).node)
    assert picked == {1, 2}


def test_best_fit_and_dot_product_pack_cpu_pods_on_a_cluster_without_gpus():
    """No node has a GPU (the largest node's GPU capacity is 0): both still score by CPU, and a CPU pod goes
    to the node it leaves fullest (b, with 6 of 16 cores free), not to the first node."""
    nodes = [NodeSpec(name, 16_000, 1 << 16) for name in ("a", "b", "c")]
    for policy in ("best-fit", "dotprod"):
        view, profile = _view(nodes, policy)
        _run(view, "used-b", PodSpec(cpu_m=10_000, memory_mib=1024), 1, ())
        _run(view, "used-c", PodSpec(cpu_m=4_000, memory_mib=1024), 2, ())
        assert place_pod(PodSpec(cpu_m=2_000, memory_mib=1024), view, profile).node == 1, policy


def _four_kinds():
    """Four 4-GPU nodes (the largest holds 400 %): `shared` one GPU with a single 30 % task; `whole` one whole
    GPU; `mixed` a whole GPU and a 60 % task; `idle` nothing."""
    view, profile = _view([gpu_node(n, gpus=4) for n in ("shared", "whole", "mixed", "idle")], "gpu-clustering")
    _run(view, "s", fraction(30, 1024), 0, (0,))
    _run(view, "w", whole(1), 1, (0,))
    _run(view, "mw", whole(1), 2, (0,))
    _run(view, "ms", fraction(60, 1024), 2, (1,))
    return view, profile


def test_gpu_clustering_bands_nodes_by_the_kinds_of_pods_they_hold_then_by_fill():
    """The simulator's bands of 25: only the pod's kind 75, its kind among others 50, idle 25, only the other
    kind 0; plus 25 · used/400 rounded down (shared 30 → 1, whole 100 → 6, mixed 160 → 10, idle 0)."""
    view, profile = _four_kinds()
    assert _scores(profile, fraction(20, 1024), view) == [76.0, 6.0, 60.0, 25.0]
    assert _scores(profile, whole(1), view) == [1.0, 81.0, 60.0, 25.0]
    assert _scores(profile, PodSpec(cpu_m=1000, memory_mib=1024), view) == [0.0, 0.0, 0.0, 0.0]  # no opinion
    assert place_pod(fraction(20, 1024), view, profile).node == 0
    assert place_pod(whole(1), view, profile).node == 1


def test_the_fixed_tie_break_is_one_order_of_distinct_scores_within_0_to_100():
    """The FGD simulator's tie-break: one seeded order of the nodes, the same for every pod, scored within
    0..100 like every score (so at weight 1e-3 it moves a node by at most 0.1, never a whole point)."""
    view, _ = _four_kinds()
    tie = profile_from_dict(
        {"name": "t", "queueSort": "PrioritySort", "filter": ["Resources"],
         "score": [{"name": "Random", "args": {"seed": 5, "fixed": True}}]}
    )  # fmt: skip
    first = _scores(tie, whole(1), view)
    assert len(set(first)) == 4 and all(0 < s <= 100 for s in first)
    assert _scores(tie, fraction(20, 1024), view) == first  # the same order for the next pod, whatever it is


@pytest.mark.parametrize("seed", range(6))
def test_the_tie_break_never_outweighs_one_point_of_the_policys_score(seed: int):
    """Twelve idle 2-GPU, 100-core nodes, one with 2 cores taken: for a 1-GPU, 1-core pod BestFit scores it
    floor(100 · (1 − ½·97/100 − ½·100/200)) = 26, every other node floor(100 · (1 − ½·99/100 − ½·½)) = 25.
    Whatever the seed, the tie-break (worth at most 0.1) leaves it to BestFit's best node."""
    nodes = [gpu_node(f"n{i}", gpus=2, cpu_m=100_000) for i in range(12)]
    view, profile = _view(nodes, "best-fit", seed)
    best = seed % 12  # a different node each seed, so the order of the tie-break is tried at several places
    _run(view, "nudge", PodSpec(cpu_m=2_000, memory_mib=1024), best, ())
    pod = whole(1, cpu_m=1000)
    scores = _scores(profile, pod, view)
    assert scores[best] == max(scores) and sorted(scores)[-2] == max(scores) - 1
    assert place_pod(pod, view, profile).node == best


def test_gpu_packing_scores_shared_gpus_then_used_nodes_then_idle_nodes_as_the_fgd_simulator_does():
    """Three 4-GPU nodes: `idle`, `used` (a whole GPU taken), `shared` (30 % of a GPU taken). A 20 % pod:
    on the shared GPU 100 − 70 // 10 = 93, on a used node's free GPU max(50 − 1, 33) = 49, on the idle node
    max(33 − 4 idle GPUs, 4) = 29. A 2-GPU pod takes two free GPUs anywhere: max(50 − 2, 33) = 48 on a node in
    use, 29 on the idle one. A CPU pod: no opinion."""
    view, profile = _view([gpu_node(n, gpus=4) for n in ("idle", "used", "shared")], "gpu-packing")
    _run(view, "w", whole(1), 1, (0,))
    _run(view, "s", fraction(30, 1024), 2, (3,))
    assert _scores(profile, fraction(20, 1024), view) == [29.0, 49.0, 93.0]
    assert _scores(profile, whole(2), view) == [29.0, 48.0, 48.0]
    assert _scores(profile, PodSpec(cpu_m=1000, memory_mib=1024), view) == [0.0, 0.0, 0.0]
    p = place_pod(fraction(20, 1024), view, profile)
    assert (p.node, p.slots) == (2, (3,))


def test_the_random_baseline_draws_anew_for_every_pod_and_spreads_them():
    """The `random` policy: a fresh uniform draw over every node per pod, so 40 small CPU pods land all over 20
    nodes (a fixed order would pile them onto one), the same pod asked about again on the same cluster gets
    another node, and its scores lie in 0..100."""
    view, profile = _view([gpu_node(f"n{i}", gpus=1) for i in range(20)], "random", seed=4)
    pod = PodSpec(cpu_m=100, memory_mib=64)
    assert all(0 <= s < 100 for s in _scores(profile, pod, view))
    assert len({place_pod(pod, view, profile).node for _ in range(10)}) > 1
    used = set()
    for i in range(40):
        p = place_pod(pod, view, profile)
        view.state.assign(f"c{i}", p)
        used.add(p.node)
    assert len(used) >= 12  # 20 · (1 − (19/20)^40) ≈ 17 expected


@pytest.mark.parametrize("field", ["_draw", "_pods"])
def test_a_profile_cannot_set_the_random_plugins_internal_state(field: str):
    """A plugin's args are its documented arguments (Random: seed, fixed), not the state it keeps."""
    with pytest.raises(ProfileError, match=r"score\[0\]: Random args"):
        profile_from_dict({"name": "t", "queueSort": "PrioritySort", "score": [{"name": "Random", "args": {field: 1}}]})
