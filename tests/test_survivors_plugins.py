"""Tests added for mutants of plugins/ that bench/mutate.py found surviving on main 445efb4 (`git show
a748550:docs/testing.md`, "Session 8"): each pins a behaviour that no test checked."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest

from conftest import gpu_node
from fairgpu.catalog import load_profile
from fairgpu.errors import ProfileError
from fairgpu.framework.placement import feasible, place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree
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


@pytest.mark.parametrize("compiled", [True, False])
def test_cpu_balance_weighs_cpu_a_cpu_light_mix_needs(compiled: bool):
    """The mix: four 1-GPU pods asking 80 m CPU each and the one placed, asking 10 m: 0.66 m per GPU percent
    (CPU-light inference, say). p has 8 idle GPUs but 320 m, CPU for under 5 of them; q and r have CPU to
    spare. The pod goes to p, where it uses a GPU that would idle for want of CPU, though q comes first and
    FGD's own measure sees no difference: cpu_balance prices starved GPUs however little CPU the mix needs
    (compiled or on the NumPy path)."""
    nodes = [gpu_node("q"), gpu_node("p", cpu_m=320), gpu_node("r")]
    assert _place_beside(nodes, [_whole(80)] * 4, 2, _whole(10), {"cpu_balance": 1.0, "compiled": compiled}) == 1


def test_cpu_balance_counts_a_node_short_of_cpu_for_under_one_percent_of_a_gpu():
    """The mix: four 1-GPU pods asking 16 cores each and the one placed, asking none: 128 m per GPU percent.
    p's 8 idle GPUs lack 64 m of CPU, half a percent of one GPU it cannot feed; q and r have CPU to spare. The
    pod goes to p, where it takes a GPU the CPU could not fully feed, not to q, which comes first: starved
    capacity counts from the first fraction of a percent, not from a whole one."""
    nodes = [gpu_node("q"), gpu_node("p", cpu_m=8 * 100 * 128 - 64), gpu_node("r")]
    assert _place_beside(nodes, [_whole(16_000)] * 4, 2, _whole(0)) == 1


def test_compiled_cpu_balance_counts_under_one_percent_of_a_gpu_starved_after_the_pod_as_the_numpy_path():
    """The mix: four 1-GPU pods asking 16 cores (placed on r) and the pod, asking 5,334 m: 69,334 m over 500 %,
    138.668 m per GPU percent. On p (102,400 m, 8 idle GPUs) the pod leaves 97,066 m for 7 GPUs: 0.0077 % of a
    GPU starved after it (61.5 % before). The compiled scores equal the NumPy path's, that fraction included."""
    nodes = [gpu_node("q"), gpu_node("p", cpu_m=8 * 100 * 128), gpu_node("r")]
    profile = _fragmentation_profile({"cpu_balance": 1.0})
    view = Scheduler(nodes, QueueTree([QueueSpec("q")]), profile).view
    compiled = _learned(profile)
    plain = copy.deepcopy(compiled)
    plain.compiled = False
    avoid = np.array([True, True, False])
    for i in range(4):
        p = place_pod(_whole(16_000), view, profile, avoid, key=f"fill{i}")
        assert p is not None
        view.state.assign(f"fill{i}", p)
        plain.learn(f"fill{i}", _whole(16_000))
    pod = _whole(5334)
    mask = feasible(pod, view, profile)
    place_pod(pod, view, profile, key="pod")  # learns it, as the NumPy twin below
    plain.learn("pod", pod)
    plain.generation(pod, view)
    a, b = compiled.score(pod, view, mask), plain.score(pod, view, mask)
    assert np.array_equal(a, b), (a, b)


def test_without_memory_cpu_balance_on_nodes_with_cpu_to_spare_scores_as_fgds_measure_alone():
    """With `memory` off no shape asks memory, so cpu_balance's memory term is 0: on nodes whose CPU feeds every
    free GPU (128 cores for 8 GPUs of 1-core pods), a GPU pod's scores with cpu_balance equal those without."""
    nodes = [gpu_node("q"), gpu_node("p", gpus=4), gpu_node("r")]
    scores = []
    for args in ({"cpu_balance": 1.0}, {}):
        view, profile = _view(nodes, args)
        for i, pod in enumerate((_whole(1000), _whole_gpus(2))):  # the mix, seen
            place_pod(pod, view, profile, key=f"s{i}")
        pod = _whole(1000)
        scores.append(_learned(profile).score(pod, view, feasible(pod, view, profile)))
    assert np.array_equal(scores[0], scores[1]), scores


def test_fragmentation_without_cpu_balance_is_fgds_measure_alone():
    """cpu_balance is off unless a profile sets it (docs/profiles.md: 1 in `fairgpu`): the CPU-short node p
    that cpu_balance prefers (test_survivors::test_cpu_balance_sends_a_cpu_light_gpu_pod_where_cpu_is_short) is
    no better to FGD's own measure, so the pod goes to q, first in node order."""
    nodes = [gpu_node("q"), gpu_node("p", cpu_m=32_000), gpu_node("r")]
    assert _place_beside(nodes, [_whole(16_000)] * 4, 2, _whole(1000), args={}) == 0
    assert _place_beside(nodes, [_whole(16_000)] * 4, 2, _whole(1000)) == 1


# -- plugins/fragmentation*.py: the rest of session 8's pending (git a748550 docs/testing.md, "Session 10") ----


def _learned(profile) -> Fragmentation:
    return next(p for p, _ in profile.score if isinstance(p, Fragmentation))


def _view(nodes, args: dict[str, object]):
    profile = _fragmentation_profile(args)
    return Scheduler(nodes, QueueTree([QueueSpec("q")]), profile).view, profile


def _whole_gpus(count: int) -> PodSpec:
    return PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(count, 100, 0, 100))


def test_fragmentation_reweighs_a_known_shape_only_once_its_count_grew_by_more_than_a_quarter():
    """Pods of a shape already in the mix leave the plugin's generation as it is, so the engine rescores only
    the nodes that changed, until the counts grew by more than a quarter since the weights were last set: from
    4 pods, the 5th (exactly a quarter more) keeps the generation, the 6th moves it; from 6, the 7th keeps it and
    the 8th moves it."""
    view, profile = _view([gpu_node("x", gpus=2), gpu_node("y", gpus=2)], {"compiled": False})
    frag, pod = _learned(profile), _whole_gpus(1)
    seen = []
    for i in range(8):
        frag.learn(f"p{i}", pod)
        seen.append(frag.generation(pod, view))
    assert seen[4] == seen[3] and seen[5] != seen[4]
    assert seen[6] == seen[5] and seen[7] != seen[6]


def test_fragmentation_places_on_each_of_two_copies_of_a_state_by_that_copy():
    """A dry run scores a copy of the state (same version, different pods) with the same plugin: each copy's
    placement follows its own nodes. The mix: 1-GPU and 4-GPU pods. On a, x has 3 GPUs free and y 4, so a
    1-GPU pod goes to x (y stays whole for a 4-GPU pod); on b, the other way round."""
    a, profile = _view([gpu_node("x", gpus=4), gpu_node("y", gpus=4)], {})
    b = replace(a, state=a.state.copy())
    frag = _learned(profile)
    for i, pod in enumerate([_whole_gpus(1), _whole_gpus(4), _whole_gpus(4)]):
        frag.learn(f"m{i}", pod)
    a.state.assign("on-x", a.state.placement_for(_whole_gpus(1), 0, (0,)))
    b.state.assign("on-y", b.state.placement_for(_whole_gpus(1), 1, (0,)))
    assert a.state.version == b.state.version
    for _ in range(2):
        pa, pb = place_pod(_whole_gpus(1), a, profile, key="m0"), place_pod(_whole_gpus(1), b, profile, key="m0")
        assert pa is not None and pb is not None and (pa.node, pb.node) == (0, 1)


def test_fragmentation_rescores_a_state_after_scoring_a_copy_of_it_and_learning_more():
    """A placement on a state, a dry run on a copy of it, then more pods of the mix arrive: the next placement
    on the state follows the new weights, not the scores cached before. The mix: 1-GPU pods (12), 2-GPU (5) and
    3-GPU (3). A 1-GPU pod on x (3 GPUs) costs the 3-GPU shape its node, on y (2 GPUs) the 2-GPU shape; with
    w2 < 3 w3 it goes to y. Six more 2-GPU pods (the sixth refreshes the weights: 26 > 1.25 x 20) make
    w2 > 3 w3, and it goes to x."""
    a, profile = _view([gpu_node("x", gpus=3), gpu_node("y", gpus=2)], {})
    frag = _learned(profile)
    mix = [_whole_gpus(1)] * 12 + [_whole_gpus(2)] * 5 + [_whole_gpus(3)] * 3
    for i, pod in enumerate(mix):
        frag.learn(f"m{i}", pod)
    one = _whole_gpus(1)
    first = place_pod(one, a, profile, key="m0")  # m0 is counted already
    assert first is not None and first.node == 1
    b = replace(a, state=a.state.copy())
    dry = place_pod(one, b, profile, key="m0")
    assert dry is not None and dry.node == 1
    for i in range(6):
        frag.learn(f"more{i}", _whole_gpus(2))
    after = place_pod(one, a, profile, key="m0")
    assert after is not None and after.node == 0


def test_fragmentation_refuses_a_mix_of_no_shapes():
    """max_shapes bounds the shapes the mix learns; 0 would learn none and score every node alike: a profile
    asking for it is refused, naming the setting."""
    with pytest.raises(ProfileError, match="max_shapes"):
        _fragmentation_profile({"max_shapes": 0})


def test_fragmentation_learns_128_shapes_by_default_and_ignores_later_ones():
    """docs/profiles.md's default max_shapes, 128: after 128 shapes that fit nowhere (each asks more CPU than any
    node has), a 4-GPU shape arriving often is not learned, so a 1-GPU pod sees every node alike and goes to x,
    first, though it leaves x without the 4 free GPUs the later shape needs (y has 5)."""
    view, profile = _view([gpu_node("x", gpus=4), gpu_node("y", gpus=5)], {"compiled": False})
    frag = _learned(profile)
    for i in range(128):
        frag.learn(f"f{i}", PodSpec(cpu_m=10**9 + i, memory_mib=1024, gpu=GpuRequest(1, 100, 0, 100)))
    for i in range(100):
        frag.learn(f"w{i}", _whole_gpus(4))
    p = place_pod(_whole_gpus(1), view, profile, key="pod")
    assert p is not None and p.node == 0


def test_fragmentation_scores_by_fgds_mapping_of_the_change_in_gpus_clipped_at_50():
    """FGD's node score, on the 0..100 scale that profile weights combine: 100 / (1 + e^(Δ/100)), Δ the change in
    fragmentation in GPU percent, clipped to ±50 GPUs. The mix: 1-GPU pods asking 1000 m. A 1000 m CPU pod
    leaves a and b too little CPU for any of it, stranding all their GPUs (2 on a: Δ = 2 GPUs; 64 on b,
    clipped to 50); on c it strands nothing (Δ = 0, the score 50)."""
    nodes = [gpu_node("a", gpus=2, cpu_m=1500), gpu_node("b", gpus=64, cpu_m=1500), gpu_node("c", gpus=2)]
    view, profile = _view(nodes, {"compiled": False})
    frag = _learned(profile)
    frag.learn("gpu", _whole_gpus(1))
    pod = PodSpec(cpu_m=1000, memory_mib=1024)
    frag.learn("cpu", pod)
    frag.generation(pod, view)
    scores = frag.score(pod, view, feasible(pod, view, profile))
    np.testing.assert_allclose(scores, [100 / (1 + np.exp(2.0)), 100 / (1 + np.exp(50.0)), 50.0], rtol=1e-12)


@pytest.mark.parametrize("compiled", [True, False])
def test_cpu_balance_counts_a_cpu_pod_as_taking_cpu_only(compiled: bool):
    """The mix: 1-GPU pods asking 1000 m, 10 m per GPU percent. y's 8 idle GPUs have CPU for 400 %; a 5 m CPU
    pod there starves half a percent more; x and z have CPU to spare. The pod goes to x, not y (first): it
    takes no GPU capacity that would offset what its CPU starves."""
    nodes = [gpu_node("y", cpu_m=4000), gpu_node("x"), gpu_node("z")]
    args = {"cpu_balance": 1.0, "compiled": compiled}
    assert _place_beside(nodes, [_whole(1000)] * 4, 2, PodSpec(cpu_m=5, memory_mib=16), args) == 1


@pytest.mark.parametrize("compiled", [True, False])
def test_cpu_balance_prices_cpu_for_a_mix_of_one_pod_asking_one_percent_of_a_gpu(compiled: bool):
    """The mix: one pod asking 100 m and 1 % of one GPU, so 100 m per GPU percent. y's 8 GPUs have CPU for
    400 %; a 100 m CPU pod there starves one percent more; x and z have CPU to spare. The pod goes to x: the
    measure holds from the first pod of the smallest share of a GPU."""
    nodes = [gpu_node("y", cpu_m=40_000), gpu_node("x"), gpu_node("z")]
    one = PodSpec(cpu_m=100, memory_mib=16, gpu=GpuRequest(1, 1, 16))
    args = {"cpu_balance": 1.0, "compiled": compiled}
    assert _place_beside(nodes, [one], 2, PodSpec(cpu_m=100, memory_mib=16), args) == 1


@pytest.mark.parametrize("compiled", [True, False])
def test_cpu_balance_prices_no_cpu_where_the_mixs_gpu_pods_ask_no_gpu_cores(compiled: bool):
    """The mix: CPU-only pods and 1-GPU pods asking GPU memory but no cores (HAMi), so no CPU per GPU percent:
    cpu_balance prices nothing, and a CPU pod goes to y, first, though y's 8 GPUs have 400 m beside them
    (x has no GPU, z CPU to spare)."""
    nodes = [gpu_node("y", cpu_m=400), gpu_node("x", gpus=0), gpu_node("z")]
    fill = [PodSpec(cpu_m=100, memory_mib=16), PodSpec(cpu_m=100, memory_mib=16, gpu=GpuRequest(1, 0, 16))]
    args = {"cpu_balance": 1.0, "compiled": compiled}
    assert _place_beside(nodes, fill, 2, PodSpec(cpu_m=5, memory_mib=16), args) == 0


def test_compiled_fragmentation_scores_as_its_numpy_path_with_no_free_gpu_capacity_left():
    """`compiled` changes nothing but speed, also where every GPU is taken (the fairgpu profile: pressure's
    ratio of free capacity to a shape's room is then 0 over 0): a CPU pod's scores, bit for bit."""
    sched = Scheduler(
        [gpu_node(f"n{i}", gpus=2) for i in range(3)], QueueTree([QueueSpec("q")]), load_profile("fairgpu")
    )
    view = sched.view
    compiled = _learned(sched.profile)
    plain = copy.deepcopy(compiled)
    plain.compiled = False
    for i in range(3):
        p = place_pod(_whole_gpus(2), view, sched.profile, key=f"w{i}")
        assert p is not None
        view.state.assign(f"w{i}", p)
        plain.learn(f"w{i}", _whole_gpus(2))
    pod = PodSpec(cpu_m=1000, memory_mib=1024)
    mask = feasible(pod, view, sched.profile)
    place_pod(pod, view, sched.profile, key="c")
    plain.learn("c", pod)
    plain.generation(pod, view)
    a, b = compiled.score(pod, view, mask), plain.score(pod, view, mask)
    assert np.array_equal(a, b), (a, b)


def test_fragmentation_counts_a_full_gpu_as_no_room_for_a_pod_asking_gpu_memory_but_no_cores():
    """HAMi puts a task asking GPU memory but no cores only on a GPU with cores free, so a full GPU is no room
    for it. The mix: 2-GPU pods asking memory only (4), a 50 % pod and a 30 % one. x has one full GPU and one
    half free, so the 2-GPU shape cannot use x at all, and a 30 % pod there costs it nothing; on y (first, both
    GPUs idle) it would take 30 % from it. The pod goes to x."""
    view, profile = _view([gpu_node("y", gpus=2), gpu_node("x", gpus=2)], {"compiled": False})
    half = PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 50, 1024))
    pod = PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 30, 1024))
    view.state.assign("full", view.state.placement_for(_whole_gpus(1), 1, (0,)))
    view.state.assign("half", view.state.placement_for(half, 1, (1,)))
    frag = _learned(profile)
    for i in range(4):
        frag.learn(f"m{i}", PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(2, 0, 1024)))
    frag.learn("half", half)
    p = place_pod(pod, view, profile, key="pod")
    assert p is not None and (p.node, p.slots) == (1, (1,))


def test_fragmentation_puts_a_shared_pod_on_the_gpu_of_its_node_it_fragments_least():
    """On the node chosen, a shared pod takes the GPU where it increases fragmentation least. The mix: 30 % and
    60 % pods. n's GPU 0 is idle, GPU 1 has 30 % free: a 30 % pod on GPU 1 costs the 60 % shape nothing (it
    cannot use GPU 1 already), on GPU 0 it takes 30 % of what that shape could use. It goes to GPU 1."""
    view, profile = _view([gpu_node("n", gpus=2)], {"compiled": False})
    pod = PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 30, 1024))
    big = PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 70, 1024))
    view.state.assign("big", view.state.placement_for(big, 0, (1,)))
    frag = _learned(profile)
    for i in range(3):
        frag.learn(f"q{i}", PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 60, 1024)))
    p = place_pod(pod, view, profile, key="pod")
    assert p is not None and p.slots == (1,)


@pytest.mark.parametrize("compiled", [False, True])
def test_fragmentation_puts_a_memory_only_pod_on_a_card_with_no_cores_to_share(compiled: bool):
    """A card HAMi shares with no cores (deviceCoreScaling 0) still takes tasks asking GPU memory but no cores,
    and no shape needing cores can ever use it: a memory-only pod there fragments nothing, as on y's idle
    ordinary card, so the first node (z) wins the tie. It once scored such a card as no room at all, and the pod
    went to y, taking memory beside cores that the mix's 50 % shape needs."""
    z = NodeSpec("z", 128_000, 1 << 20, (GpuDevice("T4", 16384, uuid="GPU-z-0", cores=0),))
    view, profile = _view([z, gpu_node("y", gpus=1, model="T4", mem_mib=16384)], {"compiled": compiled})
    frag = _learned(profile)
    for i in range(3):
        frag.learn(f"h{i}", PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 50, 4096)))
    p = place_pod(PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 0, 8000)), view, profile, key="pod")
    assert p is not None and view.state.nodes[p.node].name == "z"


# -- a cores-100 pod on cards of 200 cores (HAMi deviceCoreScaling 2): a share, not a whole card ----------------


def _share(cores: int) -> PodSpec:
    return PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, cores, 1024))


def _scaled(name: str, cards: int) -> NodeSpec:
    devices = tuple(GpuDevice("A100-80GB", 81920, uuid=f"GPU-{name}-{j}", cores=200) for j in range(cards))
    return NodeSpec(name, 128_000, 1 << 20, devices)


@pytest.mark.parametrize("compiled", [False, True])
def test_fragmentation_puts_a_cores_100_pod_on_the_200_core_card_it_fragments_least(compiled: bool):
    """HAMi's Fit makes a cores-100 task exclusive only on a card of 100 cores; on one of 200 it takes half and
    the rest stays open. The mix: 60-core pods. n's card 0 has 140 cores free, card 1 is idle: on card 0 the pod
    would leave 40 cores no 60-core pod can use, on card 1 it leaves 100, so it goes to card 1, which keeps room
    for another task. (Its cards were once taken in index order, as if every candidate were an idle card.)"""
    view, profile = _view([_scaled("n", 2)], {"compiled": compiled})
    view.state.assign("busy", view.state.placement_for(_share(60), 0, (0,)))
    frag = _learned(profile)
    for i in range(3):
        frag.learn(f"s{i}", _share(60))
    p = place_pod(_share(100), view, profile, key="pod")
    assert p is not None and p.slots == (1,)
    view.state.assign("pod", p)
    assert view.state.gpu_cores_free[0, :2].tolist() == [140, 100] and not view.state.gpu_exclusive.any()


@pytest.mark.parametrize("compiled", [False, True])
def test_fragmentation_sends_a_cores_100_pod_where_its_200_core_card_keeps_room_for_the_mix(compiled: bool):
    """Nodes a (one 200-core card, 130 cores free) and b (one idle 200-core card); the mix: 60-core pods. On a the
    cores-100 pod leaves 30 cores no 60-core pod can use, on b 100 that one can: it goes to b. (It was once scored
    as taking a whole GPU: a's card then looked like 30 cores lost, b's like 100, and it went to a.)"""
    view, profile = _view([_scaled("a", 1), _scaled("b", 1)], {"compiled": compiled})
    view.state.assign("busy", view.state.placement_for(_share(70), 0, (0,)))
    frag = _learned(profile)
    for i in range(3):
        frag.learn(f"s{i}", _share(60))
    p = place_pod(_share(100), view, profile, key="pod")
    assert p is not None and view.state.nodes[p.node].name == "b"


def test_fragmentation_with_nothing_learned_leaves_the_gpu_to_the_next_plugin():
    """Before any GPU pod was placed for real (a dry run: an explanation, a reservation), Fragmentation has no
    mix and no opinion: it scores every node 0 and leaves the card to the next score plugin, as it leaves the
    node. Here Spread takes the emptier card, 1 (card 0 holds a 70-core pod); Fragmentation once kept index
    order, and ordering by its empty measure would take the fullest card."""
    from fairgpu.catalog import profile_from_dict

    score = [{"name": "Fragmentation", "args": {"compiled": False}}, {"name": "Spread", "weight": 0.001}]
    profile = profile_from_dict({"name": "t", "queueSort": "PrioritySort", "filter": ["Resources"], "score": score})
    view = Scheduler([gpu_node("n", gpus=2)], QueueTree([QueueSpec("q")]), profile).view
    view.state.assign("busy", view.state.placement_for(_share(70), 0, (0,)))
    p = place_pod(_share(30), view, profile)
    assert p is not None and p.slots == (1,)
