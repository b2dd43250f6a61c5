"""Filters, scores and GPU choice: node selector/affinity/taints, GPU UUIDs, unhealthy GPUs and cordoned
nodes, HAMi per-pod policies, fragmentation, the FGD baselines, gangs, and a no-over-commit property."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.conftest import fraction, gpu_node, whole

from fairgpu.catalog import load_profile, profile_from_dict
from fairgpu.errors import RequestError
from fairgpu.framework.interfaces import FitMask
from fairgpu.framework.placement import filter_breakdown, place_all, place_pod, unplaced_cause
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload
from fairgpu.model.constraints import MatchExpression, Taint, Toleration
from fairgpu.plugins.fit import Resources
from fairgpu.plugins.fragmentation_nodes import shapes_fit


def view_of(nodes: list[NodeSpec], profile: str = "fairgpu"):
    prof = load_profile(profile)
    return Scheduler(nodes, QueueTree([QueueSpec("q")]), prof).view, prof


def scored(scores: list, filters: tuple[str, ...] = ("NodeAffinity", "GpuType", "Resources")):
    return profile_from_dict({"name": "t", "queueSort": "PrioritySort", "filter": list(filters), "score": scores})


_tried = iter(range(1 << 30))


def place(pod: PodSpec, view, prof, exclude: np.ndarray | None = None):
    """place_pod as the scheduler calls it: a real attempt, under a key of its own, so the profile learns the pod."""
    return place_pod(pod, view, prof, exclude, key=f"pod-{next(_tried)}")


def fits(pod: PodSpec, nodes: list[NodeSpec], profile: str = "fairgpu") -> list[str]:
    view, prof = view_of(nodes, profile)
    from fairgpu.framework.placement import feasible

    return [view.state.node_names[i] for i in np.flatnonzero(feasible(pod, view, prof).nodes)]


# -- NodeAffinity: selector, required affinity, taints ----------------------------------------------------
def labelled() -> list[NodeSpec]:
    return [
        gpu_node("a", labels={"zone": "a", "rack": "3"}),
        gpu_node("b", labels={"zone": "b", "rack": "12"}),
        gpu_node("c", labels={}),
    ]


@pytest.mark.parametrize("profile", ["fairgpu", "kube-default"])
def test_node_selector_keeps_nodes_with_every_label(profile: str) -> None:
    pod = replace(whole(), node_selector=(("zone", "b"),))
    assert fits(pod, labelled(), profile) == ["b"]
    assert fits(replace(whole(), node_selector=(("zone", "b"), ("rack", "3"))), labelled(), profile) == []


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (MatchExpression("zone", "In", ("a", "b")), ["a", "b"]),
        (MatchExpression("zone", "NotIn", ("a",)), ["b", "c"]),  # a node without the label passes NotIn
        (MatchExpression("zone", "Exists"), ["a", "b"]),
        (MatchExpression("zone", "DoesNotExist"), ["c"]),
        (MatchExpression("rack", "Gt", ("5",)), ["b"]),  # compared as integers, not strings
        (MatchExpression("rack", "Lt", ("5",)), ["a"]),
    ],
)
def test_required_node_affinity_operators(expr: MatchExpression, expected: list[str]) -> None:
    assert fits(replace(whole(), affinity=((expr,),)), labelled()) == expected


def test_affinity_terms_are_ored_and_expressions_anded() -> None:
    a_and_b = (MatchExpression("zone", "In", ("a",)), MatchExpression("rack", "In", ("12",)))
    assert fits(replace(whole(), affinity=(a_and_b,)), labelled()) == []
    either = ((MatchExpression("zone", "In", ("a",)),), (MatchExpression("zone", "DoesNotExist"),))
    assert fits(replace(whole(), affinity=either), labelled()) == ["a", "c"]


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"key": "k", "operator": "Near"}, "operator"),
        ({"key": "k", "operator": "In"}, "values"),
        ({"key": "k", "operator": "Exists", "values": ("x",)}, "values"),
        ({"key": "k", "operator": "Gt", "values": ("x",)}, "values"),
    ],
)
def test_bad_match_expressions_name_the_field(kwargs: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=f"^{problem}:"):
        MatchExpression(**kwargs)


def tainted() -> list[NodeSpec]:
    return [
        gpu_node("plain"),
        gpu_node("gpu-only", taints=(Taint("dedicated", "gpu", "NoSchedule"),)),
        gpu_node("draining", taints=(Taint("drain", "", "NoExecute"),)),
        gpu_node("soft", taints=(Taint("spot", "", "PreferNoSchedule"),)),
    ]


@pytest.mark.parametrize("profile", ["fairgpu", "kube-default"])
def test_untolerated_noschedule_and_noexecute_taints_exclude_nodes(profile: str) -> None:
    assert fits(whole(), tainted(), profile) == ["plain", "soft"]


@pytest.mark.parametrize(
    ("toleration", "extra"),
    [
        (Toleration("dedicated", "Equal", "gpu", "NoSchedule"), ["gpu-only"]),
        (Toleration("dedicated", "Equal", "cpu"), []),  # value must match
        (Toleration("dedicated", "Exists"), ["gpu-only"]),
        (Toleration("dedicated", "Exists", effect="NoExecute"), []),  # effect must match
        (Toleration(operator="Exists"), ["gpu-only", "draining"]),  # empty key tolerates everything
    ],
)
def test_tolerations(toleration: Toleration, extra: list[str]) -> None:
    got = fits(replace(whole(), tolerations=(toleration,)), tainted())
    assert sorted(got) == sorted(["plain", "soft", *extra])


def test_taint_and_toleration_validation() -> None:
    with pytest.raises(ValueError, match=r"^effect:"):
        Taint("k", "", "Sometimes")
    with pytest.raises(ValueError, match=r"^key:"):
        Toleration("", "Equal", "v")
    with pytest.raises(ValueError, match=r"^value:"):
        Toleration("k", "Exists", "v")


def test_breakdown_counts_nodes_per_affinity_reason() -> None:
    nodes = [*labelled(), gpu_node("t", labels={"zone": "b"}, taints=(Taint("x"),))]
    view, prof = view_of(nodes)
    ok, why = filter_breakdown(replace(whole(), node_selector=(("zone", "b"),)), view, prof)
    assert ok == 1
    assert why == {"node selector does not match": 2, "untolerated taint": 1}


# -- GpuType: models and UUIDs ------------------------------------------------------------------------------
def test_gpu_uuid_include_and_exclude_pick_gpus() -> None:
    nodes = [gpu_node("n0", gpus=4), gpu_node("n1", gpus=4)]
    pod = replace(fraction(10, 1024), gpu_uuid_include=("GPU-n1-2", "GPU-n1-3"))
    view, prof = view_of(nodes)
    p = place(pod, view, prof)
    assert p is not None and p.node == 1 and p.slots[0] in (2, 3)
    two = replace(whole(2), gpu_uuid_exclude=("GPU-n0-0", "GPU-n0-1", "GPU-n0-2"))
    p = place(two, view, prof)
    assert p is not None and p.node == 1
    view, prof = view_of([gpu_node("n0", gpus=4)])
    only_bad = replace(whole(2), gpu_uuid_exclude=("GPU-n0-0", "GPU-n0-1", "GPU-n0-2"))
    assert place(only_bad, view, prof) is None
    assert filter_breakdown(only_bad, view, prof)[1] == {"GPU UUID or vgpu-mode excluded": 1}


def test_gpu_model_include_exclude() -> None:
    nodes = [gpu_node("a", model="A100-80GB"), gpu_node("t", model="T4", mem_mib=15360)]
    assert fits(replace(whole(), gpu_include=("t4",)), nodes) == ["t"]
    assert fits(replace(whole(), gpu_exclude=("A100",)), nodes) == ["t"]


def test_a_whole_card_recording_exactly_its_memory_fits_and_one_mib_more_does_not() -> None:
    """A T4 has 15,360 MiB: a whole card asking gpumem 15,360 takes it (HAMi checks request <= capacity), one
    asking 15,361 fits only the A100; the last MiB decides, on the full filter as on a few changed rows."""
    nodes = [gpu_node("a", gpus=1), gpu_node("t", gpus=1, model="T4", mem_mib=15360)]
    assert fits(fraction(100, 15_360), nodes) == ["a", "t"]
    assert fits(fraction(100, 15_361), nodes) == ["a"]
    view, _ = view_of(nodes)
    for compiled in (True, False):  # the node kernel's pass and the NumPy one, on the T4's row alone
        for pod, fit in ((fraction(100, 15_360), True), (fraction(100, 15_361), False)):
            mask = FitMask(np.ones(1, dtype=bool), rows=np.array([1]))
            Resources(compiled=compiled).filter(pod, view, mask)
            assert bool(mask.nodes[0]) is fit, (compiled, pod)


def test_a_card_that_reports_no_memory_takes_no_whole_card_pod_recording_gpumem() -> None:
    """A register entry with devmem 0 (a card HAMi cannot see the memory of): a whole-card pod recording 1 MiB
    of gpumem does not fit it, one recording none does, compiled as on the NumPy path."""
    view, _ = view_of([gpu_node("z", gpus=1, model="T4", mem_mib=0)])
    for compiled in (True, False):
        for pod, fit in ((fraction(100, 1), False), (whole(1), True)):
            mask = FitMask(np.ones(1, dtype=bool), rows=np.array([0]))
            Resources(compiled=compiled).filter(pod, view, mask)
            assert bool(mask.nodes[0]) is fit, (compiled, pod)


# -- Resources: unhealthy GPUs and cordoned nodes -------------------------------------------------------------
def test_unhealthy_gpus_and_cordoned_nodes_are_never_used() -> None:
    sick = NodeSpec(
        "sick", 64_000, 1 << 20, (GpuDevice("A100", 81920, "u0", healthy=False), GpuDevice("A100", 81920, "u1"))
    )
    cordoned = gpu_node("cordoned", schedulable=False)
    view, prof = view_of([sick, cordoned])
    assert place(whole(2), view, prof) is None
    p = place(fraction(20, 1024), view, prof)
    assert p is not None and (p.node, p.slots) == (0, (1,))
    _, why = filter_breakdown(whole(2), view, prof)
    assert why == {"node cordoned": 1, "too few GPUs": 1}


def test_a_task_asking_no_cores_takes_a_card_with_its_last_core_left_on_every_path() -> None:
    """Card 0 with 99 of its 100 cores taken, card 1 with all 100: a 0-core task may take card 0 only (HAMi
    wants a core left on a card with cores), on a few changed rows and on every node, compiled and NumPy."""
    view, _ = view_of([gpu_node("a", gpus=2, split_count=4)])
    for s, cores in ((0, 99), (1, 100)):
        view.state.assign(f"t{s}", view.state.placement_for(PodSpec(gpu=GpuRequest(1, cores, 1024)), 0, (s,)))
    pod = PodSpec(gpu=GpuRequest(1, 0, 1024))
    for compiled in (True, False):
        for rows in (np.array([0]), slice(None)):
            mask = FitMask(np.ones(1, dtype=bool), rows=rows)
            Resources(compiled=compiled).filter(pod, view, mask)
            assert mask.slots is not None and mask.slots.tolist() == [[True, False]], (compiled, rows)


def test_the_card_kernels_write_nothing_where_the_verdicts_go_nowhere_else() -> None:
    """`node_kernels.NOWHERE`, Resources.filter's targets when the verdicts stay its own: `_write` skips only an
    empty one; any other would be written at the rows' node indices, past its end (the kernels check no
    bounds). With its own targets the verdicts land at the rows given, nowhere else."""
    from fairgpu.plugins import node_kernels

    assert [a.size for a in node_kernels.NOWHERE] == [0, 0]
    view, _ = view_of([gpu_node("a", gpus=2), gpu_node("b", gpus=2)])
    nodes, slots = np.zeros(2, dtype=bool), np.zeros((2, 2), dtype=bool)
    pod = fraction(20, 1024)
    assert pod.gpu is not None
    got = Resources._compiled(pod, pod.gpu, view.state, np.array([1]), False, nodes, slots)
    assert got[0].tolist() == [True] and nodes.tolist() == [False, True] and slots.tolist() == [[0, 0], [1, 1]]


def test_an_unhealthy_card_takes_no_shared_pod_on_a_few_changed_rows_compiled_as_on_the_numpy_path() -> None:
    """A node with an unhealthy card beside a healthy one, both idle: a shared-card pod may take the healthy
    one only, and a pod asking two such cards does not fit; the node kernel's pass on the node's row alone
    (`cards`) as the NumPy one."""
    sick = NodeSpec(
        "sick", 64_000, 1 << 20, (GpuDevice("A100", 81920, "u0", healthy=False), GpuDevice("A100", 81920, "u1"))
    )
    view, _ = view_of([sick])
    for compiled in (True, False):
        mask = FitMask(np.ones(1, dtype=bool), rows=np.array([0]))
        Resources(compiled=compiled).filter(fraction(20, 1024), view, mask)
        assert mask.nodes.tolist() == [True] and mask.slots is not None, compiled
        assert mask.slots.tolist() == [[False, True]], compiled
        mask = FitMask(np.ones(1, dtype=bool), rows=np.array([0]))
        Resources(compiled=compiled).filter(PodSpec(gpu=GpuRequest(2, 20, 1024)), view, mask)
        assert mask.nodes.tolist() == [False], compiled


@pytest.mark.parametrize("profile", ["fairgpu", "kube-default"])
def test_a_cluster_without_nodes_places_nothing(profile: str) -> None:
    """Before any node is known (a controller starting): no node fits, and looking for the first that does
    must not fail on an empty array."""
    view, prof = view_of([], profile)
    for pod in (whole(1), fraction(20, 1024), PodSpec(cpu_m=100, memory_mib=64)):
        assert place(pod, view, prof) is None
        assert place(pod, view, prof, exclude=np.zeros(0, dtype=bool)) is None


# -- HAMi requests ------------------------------------------------------------------------------------------
def test_invalid_requests_are_never_placed() -> None:
    from fairgpu.model import gpu_request

    for bad in ({"nvidia.com/gpumem": "1.5"}, {"nvidia.com/gpu": "-1"}, {"nvidia.com/gpumem": "-5"}):
        with pytest.raises(RequestError):
            gpu_request(bad)
    view, _ = view_of([gpu_node("t", model="T4", mem_mib=15360)])
    too_big = PodSpec(gpu=GpuRequest(1, 10, 16000))
    assert "more than any node has" in view.state.unplaceable_reason(too_big)
    with pytest.raises(RequestError, match=r"^node_policy:"):
        PodSpec(node_policy="pack")


def test_one_container_never_gets_two_slots_of_one_gpu() -> None:
    view, _ = view_of([gpu_node("n", gpus=2)])
    st_ = view.state
    assert not st_.fits(replace(st_.placement_for(fraction(10, 100), 0, (0,)), slots=(0, 0), mem_mib=(100, 100)))


# -- scores: per-pod policy, spread/binpack, fragmentation, gangs ------------------------------------------------
def test_pod_policy_binpack_and_spread_at_node_and_gpu_level() -> None:
    view, prof = view_of([gpu_node("n0", gpus=4), gpu_node("n1", gpus=4)])
    view.state.assign("seed", view.state.placement_for(fraction(30, 1024), 0, (1,)))
    pack = replace(fraction(20, 1024), node_policy="binpack", gpu_policy="binpack")
    spread = replace(fraction(20, 1024), node_policy="spread", gpu_policy="spread")
    p = place(pack, view, prof)
    assert (p.node, p.slots) == (0, (1,))
    p = place(spread, view, prof)
    assert p.node == 1
    p = place(replace(fraction(20, 1024), node_policy="binpack", gpu_policy="spread"), view, prof)
    assert p.node == 0 and p.slots != (1,)


def test_fragmentation_keeps_whole_gpus_for_whole_gpu_pods() -> None:
    view, prof = view_of([gpu_node("n0", gpus=2), gpu_node("n1", gpus=2)])
    for _ in range(3):  # the mix so far: whole GPUs
        place(whole(), view, prof)
    view.state.assign("half", view.state.placement_for(fraction(50, 1024), 0, (0,)))
    p = place(fraction(50, 1024), view, prof)
    assert (p.node, p.slots) == (0, (0,))  # fills the half-used GPU rather than opening a whole one


def test_fragmentation_learns_each_pod_it_is_asked_to_place_once_and_nothing_from_dry_runs() -> None:
    view, prof = view_of([gpu_node("n0", gpus=2)])
    frag = next(s for s, _ in prof.score if type(s).__name__ == "Fragmentation")
    place_pod(whole(2), view, prof)  # a dry run (explanation, preemption, estimated start): no key
    assert len(frag._mix.keys) == 0
    for _ in range(3):  # the same pod tried again and again
        place_pod(fraction(30, 1024), view, prof, key="a")
    place_pod(whole(), view, prof, key="b")
    assert len(frag._mix.keys) == 2 and list(frag._mix.count) == [0.3, 1.0]  # by GPU demand, each pod once


def test_a_gang_retried_every_cycle_weighs_in_the_mix_as_its_pods_once() -> None:
    """x: 2 GPUs, 64 cores; y: 3 GPUs, 34 cores. Gang A (three 2-GPU pods, 6 GPUs of the 5) never fits; every
    cycle its first two pods are scored and placed, then given back. Gang B (two 1-GPU pods asking 30 cores)
    runs and finishes. Then C (1 GPU, 8 cores) comes. FGD's measure, by pod counts: C on x leaves A no room
    there (+100·w_A, the change in fragmentation in % of a GPU); on y it leaves 26 cores, too few for B
    (+200·w_B). Each pod once: w_A = w_B = 2/5, so x (40 < 80). Counted on every try, A's two pods of each
    of the five cycles would outweigh B's by 5 to 1 and C would go to y."""
    nodes = [gpu_node("x", gpus=2, cpu_m=64_000), gpu_node("y", gpus=3, cpu_m=34_000)]
    prof = profile_from_dict({
        "name": "t", "queueSort": "PrioritySort", "filter": ["GpuType", "Resources"],
        "score": [{"name": "Fragmentation"}], "gang": True, "permit": ["Gang"],
    })  # fmt: skip
    sched = Scheduler(nodes, QueueTree([QueueSpec("q")]), prof)
    sched.submit(Workload("a", "q", (whole(2, cpu_m=0),) * 3))
    sched.submit(Workload("b", "q", (whole(cpu_m=30_000),) * 2, submit_time=1))
    assert [b.workload for b in sched.cycle(0).bound] == ["b", "b"]
    sched.remove("b", finished_at=1)
    for t in range(2, 6):
        assert sched.cycle(t).bound == []
    sched.submit(Workload("c", "q", (whole(cpu_m=8000),), submit_time=6))
    (bound,) = sched.cycle(6).bound
    assert sched.state.node_names[bound.placement.node] == "x"
    frag = sched.profile.score[0][0]  # the engine's own copy of the profile
    np.testing.assert_allclose(frag._mix.p, [0.4, 0.4, 0.2])


def test_fragmentation_weighs_up_shapes_few_nodes_can_still_take() -> None:
    """The per-shape host counts follow every placement, and a shape with h < scarce hosts weighs
    2^ceil(log2(scarce / h)) times its share of the mix."""
    big = [gpu_node(f"big{i}", gpus=8, cpu_m=128_000) for i in range(2)]
    small = [gpu_node(f"s{i}", gpus=8, cpu_m=96_000) for i in range(6)]
    view, _ = view_of(big + small)
    prof = scored([{"name": "Fragmentation", "args": {"scarce": 8}}])
    frag = prof.score[0][0]
    hungry = whole(8, cpu_m=120_000)  # fits the two 128-core nodes only
    place(hungry, view, prof)  # seen, not placed
    for i, pod in enumerate([whole(1, cpu_m=4000)] * 5 + [fraction(30, 1024)] * 5):
        view.state.assign(f"p{i}", place(pod, view, prof))
        agg = frag._aggregates(view.state)
        np.testing.assert_array_equal(
            agg.hosts, shapes_fit(agg, frag._mix, slice(None), agg.fit_count, agg.cpu, agg.mem).sum(axis=0)
        )
        boost = np.where(agg.hosts < 8, np.exp2(np.ceil(np.log2(8 / np.maximum(agg.hosts, 1)))), 1.0)
        np.testing.assert_allclose(frag._w, frag._mix.p * boost, rtol=1e-6)
    t = frag._mix.keys[(120_000, 0, 8, 100, (), ())]
    assert agg.hosts[t] == 2 and frag._w[t] == pytest.approx(4 * frag._mix.p[t])
    assert all(p.node >= 2 for p in map(view.state.placement, view.state.placed_keys()))  # the two kept whole


def test_unconstrained_pod_leaves_the_only_model_a_constrained_shape_can_use() -> None:
    """One T4 node (1 GPU), two G2 nodes (2 GPUs each), no CPU asked. The mix so far: a 2-GPU pod (A), two
    1-GPU pods allowing only T4 (B), and the 1-GPU pod to place (C, any model). By GPU demand A 2/5, B 2/5,
    C 1/5; pressure (free capacity of the cluster / that the shape can use, to a power of two): A 500/400 → 1,
    B 500/100 → 4, C 1; scarce (16 / hosts, up to a power of two): A 8, B 16, C 8. So w = 3.2, 25.6, 1.6.
    Change in fragmentation (% of a GPU; the pod's own 100 taken off): T4 node −100 + 100·(25.6 + 1.6) = 2,620;
    a G2 node −100 − 100·1.6 + 200·(3.2 + 1.6) = 700. C goes to G2 (GPUs squared and no pressure took T4).
    The scheduler's cycle and the fill experiment both place through place_pod with this profile."""
    nodes = [
        gpu_node("t4", gpus=1, model="T4"),
        gpu_node("g2a", gpus=2, model="G2"),
        gpu_node("g2b", gpus=2, model="G2"),
    ]
    view, prof = view_of(nodes)
    frag = next(s for s, _ in prof.score if type(s).__name__ == "Fragmentation")
    t4_only = whole(cpu_m=0, gpu_include=("T4",))
    for pod in (whole(2, cpu_m=0), t4_only, t4_only):  # seen, not placed
        place(pod, view, prof)
    p = place(whole(cpu_m=0), view, prof)
    np.testing.assert_allclose(frag._w, [3.2, 25.6, 1.6], rtol=1e-6)
    assert view.state.node_names[p.node] in ("g2a", "g2b")


@pytest.mark.parametrize("memory", [True, False])
def test_a_pod_taking_memory_strands_the_gpus_of_the_shape_that_needed_it(memory: bool) -> None:
    """Two 8-GPU nodes: big (72 cores, 768 GiB) and small (256 cores, 512 GiB). The mix so far: one 8-GPU pod
    asking 64 cores and 700 GiB, which only big can host (seen, not placed). Then a CPU-only pod asking 8 cores
    and 80 GiB. With memory in the measure the shape has one host and half the free capacity, so
    w = 1 (its share) x 16 (scarce: 16 / 1 host) x 2 (pressure: 1,600 free / 800 where it fits) = 32; on big
    the pod leaves 688 GiB < 700, so the shape's 800 usable cores are lost: +25,600, on small 0. Blind to
    memory (FGD's measure) both nodes score 0 and Binpack's tie-break takes big, the fuller by CPU and memory."""
    gib = 1024
    nodes = [
        gpu_node("big", cpu_m=72_000, memory_mib=768 * gib),
        gpu_node("small", cpu_m=256_000, memory_mib=512 * gib),
    ]
    view, prof = view_of(nodes)
    frag = next(s for s, _ in prof.score if type(s).__name__ == "Fragmentation")
    frag.memory = memory
    place(replace(whole(8, cpu_m=64_000), memory_mib=700 * gib), view, prof)
    p = place(PodSpec(cpu_m=8000, memory_mib=80 * gib), view, prof)
    assert p is not None
    np.testing.assert_allclose(frag._w, [32.0 if memory else 8.0])
    assert view.state.node_names[p.node] == ("small" if memory else "big")


def test_a_pod_taking_memory_beside_free_gpus_pays_for_those_the_shape_then_cannot_feed() -> None:
    """Two idle 2-GPU nodes: a (128 GiB) and b (256 GiB), 128 cores each. The mix so far: a 1-GPU pod asking
    4 cores and 64 GiB (seen, not placed): 64 GiB per GPU, so a's memory feeds both its GPUs, b's four. Then a
    CPU-only pod asking 4 cores and 32 GiB. The shape still fits both nodes after it (one pod's worth of CPU
    and memory), so FGD's measure is 0 on both, and the CPU each free GPU needs (80 cores per GPU, CPU-only
    pods included) is there on both. On a the 96 GiB left feed 96 / 64 = 1.5 of the 2 free GPUs: 50 % of a GPU
    starves, priced at the shape's weight 1 x 8 (scarce: 16 / 2 hosts) = +400; on b 224 GiB feed 3.5 >= 2: 0.
    The pod goes to b. Blind to the shape's next pods (memory only as whether one fits), both score 0 and
    Binpack's tie-break takes a, the fuller by memory."""
    gib = 1024
    nodes = [gpu_node("a", gpus=2, memory_mib=128 * gib), gpu_node("b", gpus=2, memory_mib=256 * gib)]
    view, prof = view_of(nodes)
    frag = next(s for s, _ in prof.score if type(s).__name__ == "Fragmentation")
    place(replace(whole(cpu_m=4000), memory_mib=64 * gib), view, prof)  # seen, not placed
    p = place(PodSpec(cpu_m=4000, memory_mib=32 * gib), view, prof)
    assert p is not None
    np.testing.assert_allclose(frag._w, [8.0])
    assert view.state.node_names[p.node] == "b"


def test_cpu_only_pods_count_in_the_cpu_each_free_gpu_needs() -> None:
    """g2: 8 GPUs, 96 cores, 4 of them taken; t4: 2 GPUs, 128 cores. The mix so far: a CPU-only pod asking 10
    cores, then a 1-GPU pod asking 10 (seen, not placed): 20 cores per GPU, CPU-only pods included. A
    CPU-only 10-core pod on g2 leaves 82 cores for 8 GPUs that need 160: GPU capacity its CPU cannot feed
    goes from 800 - 92,000 / 200 = 340 to 390 (% of a GPU), priced at the weight of the shape that can use it
    (1 x 8, scarce: 16 / 2 hosts) = +400; t4 keeps 118 cores for 2 GPUs needing 40: 0. The GPU shape fits
    both nodes before and after, so FGD's own measure is 0 on both. Counting GPU pods' CPU alone (10 per
    GPU), g2's 82 cores still feed its 8 GPUs, both score 0 and Binpack's tie-break takes g2, the fuller."""
    nodes = [gpu_node("g2", gpus=8, cpu_m=96_000), gpu_node("t4", gpus=2, model="T4", cpu_m=128_000)]
    view, prof = view_of(nodes)
    view.state.assign("busy", view.state.placement_for(PodSpec(cpu_m=4000, memory_mib=1024), 0, ()))
    frag = next(s for s, _ in prof.score if type(s).__name__ == "Fragmentation")
    for pod in (PodSpec(cpu_m=10_000, memory_mib=1024), whole(cpu_m=10_000)):  # seen, not placed
        place(pod, view, prof)
    assert frag._mix.cpu_only_per_core == pytest.approx(100.0)  # millicores per GPU percent, beside the shape's 100
    np.testing.assert_allclose(frag._w, [8.0])
    p = place(PodSpec(cpu_m=10_000, memory_mib=1024), view, prof)
    assert p is not None and view.state.node_names[p.node] == "t4"


def test_cpu_a_node_keeps_is_priced_at_the_need_of_the_shapes_that_can_use_its_gpus() -> None:
    """h: 8 idle GPUs, 128 cores; l: 8 GPUs, 2 taken, 48 cores left. The mix so far (seen, not placed, by GPU
    demand): A, 8 GPUs and 120 cores (15 per GPU), weight 1/2; C, 1 GPU and 2 cores, eight of them, 1/2.
    A CPU-only pod asking 40 cores. On h it leaves 88 < 120 cores: A loses its only host, FGD's own measure
    +1/2 x 800 = +400 (h's 88 cores still feed its 8 GPUs at A's and C's 136 / 16 = 8.5 per GPU). On l only
    C can use the 6 free GPUs (A needs 8), at 2 cores per GPU: 48 cores feed them all, the 8 left feed 4, so
    2 GPUs starve, priced at C's weight: +1/2 x 200 = +100; C still fits, so FGD's measure is 0. The pod goes
    to l. Priced at the mix's average need instead (8.5 per GPU) and weight 1, l went from 6 - 48 / 8.5 =
    0.35 to 6 - 8 / 8.5 = 5.06 starved GPUs, +471, and the pod broke h."""
    prof = scored([{"name": "Fragmentation", "args": {"by_demand": True, "cpu_balance": 1.0}}])
    view = Scheduler([gpu_node("h"), gpu_node("l", cpu_m=96_000)], QueueTree([QueueSpec("q")]), prof).view
    view.state.assign("busy", view.state.placement_for(whole(2, cpu_m=48_000), 1, (0, 1)))
    for pod in [whole(8, cpu_m=120_000)] + [whole(cpu_m=2000)] * 8:  # seen, not placed
        place(pod, view, prof)
    p = place(PodSpec(cpu_m=40_000, memory_mib=1024), view, prof)
    assert p is not None and view.state.node_names[p.node] == "l"


def test_unplaced_cause_names_what_rules_out_every_node() -> None:
    """A 1-GPU T4 node (4 cores, 8 GiB) and a 2-GPU G2 node (64 cores) with 50 % of one GPU taken: 250 % of a
    GPU free, 100 of it on T4, one idle GPU per node."""
    nodes = [
        gpu_node("t4", gpus=1, model="T4", cpu_m=4000, memory_mib=8192),
        gpu_node("g2", gpus=2, model="G2", cpu_m=64_000),
    ]
    st = view_of(nodes)[0].state
    st.assign("half", st.placement_for(fraction(50, 1024), 1, (0,)))

    def gpus(count: int, cores: int = 100, cpu_m: int = 1000, memory_mib: int = 1024, **kw) -> PodSpec:
        return PodSpec(cpu_m=cpu_m, memory_mib=memory_mib, gpu=GpuRequest(count, cores, 0, cores), **kw)

    assert unplaced_cause(gpus(3), st) == "no GPU capacity left"  # 300 > 250
    assert unplaced_cause(gpus(2, gpu_include=("T4",)), st) == "no allowed GPU model has room"  # 200 > 100
    assert unplaced_cause(gpus(2), st) == "too few GPUs on one node"  # 250 free, one idle GPU per node
    assert unplaced_cause(gpus(1, cpu_m=100_000), st) == "CPU"
    assert unplaced_cause(gpus(1, memory_mib=2 << 20), st) == "memory"
    assert unplaced_cause(PodSpec(cpu_m=100_000, memory_mib=1024), st) == "CPU"
    st.assign("t4", st.placement_for(fraction(70, 1024), 0, (0,)))
    st.assign("g2", st.placement_for(fraction(70, 1024), 1, (1,)))
    assert unplaced_cause(gpus(1, cores=60), st) == "fragmentation"  # 30 + 50 + 30 free, no GPU has 60


@pytest.mark.parametrize("name", ["Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "Fragmentation"])
def test_every_fgd_baseline_places_only_where_it_fits(name: str) -> None:
    nodes = [gpu_node(f"n{i}", gpus=2, cpu_m=8000) for i in range(3)]
    view, _ = view_of(nodes)
    prof = scored([{"name": name}])
    pods = [fraction(60, 1024), whole(2), fraction(30, 1024), whole(), fraction(50, 1024), PodSpec(cpu_m=1000)] * 3
    for i, pod in enumerate(pods):
        p = place(pod, view, prof)
        if p is not None:
            view.state.assign(str(i), p)
    view.state.check_invariants()


def test_gpu_packing_prefers_a_shared_gpu() -> None:
    view, _ = view_of([gpu_node("n0", gpus=2), gpu_node("n1", gpus=2)])
    view.state.assign("x", view.state.placement_for(fraction(40, 1024), 1, (1,)))
    p = place(fraction(30, 1024), view, scored([{"name": "GpuPacking"}]))
    assert (p.node, p.slots) == (1, (1,))


def test_fixed_random_tie_break_piles_pods_onto_one_node_until_it_is_full() -> None:
    """The FGD simulator's tie-break: among equal scores always the first node of one seeded random order.
    GpuPacking has no opinion on CPU-only pods, so they fill one node before the next is used."""
    view, _ = view_of([gpu_node(f"n{i}", gpus=2, cpu_m=4000) for i in range(6)])
    prof = scored([{"name": "GpuPacking"}, {"name": "Random", "weight": 1e-3, "args": {"seed": 7, "fixed": True}}])
    used = []
    for i in range(8):
        p = place(PodSpec(cpu_m=1000), view, prof)
        view.state.assign(f"c{i}", p)
        used.append(p.node)
    assert len(set(used[:4])) == 1 and len(set(used[4:])) == 1 and used[0] != used[4]


def test_gang_spans_as_few_nodes_as_possible() -> None:
    view, prof = view_of([gpu_node(f"n{i}", gpus=8) for i in range(4)])
    placed = place_all([whole(2)] * 4, [f"g{i}" for i in range(4)], view, prof)
    assert len(placed) == 4 and len({p.node for p in placed}) == 1


# -- property: never over-commit ------------------------------------------------------------------------------
def fits_somewhere(pod: PodSpec, st_) -> bool:
    """An oracle written apart from the filters: does some node have the CPU, memory and enough GPUs that
    can each take this pod under HAMi's rules (whole card: idle; share: cores, memory, task count)?"""
    for n in range(st_.num_nodes):
        if st_.cpu_free[n] < pod.cpu_m or st_.mem_free[n] < pod.memory_mib:
            continue
        g = pod.gpu
        if g is None:
            return True
        slots = range(len(st_.nodes[n].gpus))
        need = [g.mem_for(st_.nodes[n].gpus[s].memory_mib) for s in slots]
        if g.exclusive:  # an idle card, with the memory the request records (HAMi checks it for any cores)
            ok = [s for s in slots if st_.gpu_tasks[n, s] == 0 and st_.gpu_mem_cap[n, s] >= need[s]]
        else:
            ok = [
                s
                for s in slots
                if not st_.gpu_exclusive[n, s]
                and st_.gpu_tasks[n, s] < st_.split[n]
                and st_.gpu_cores_free[n, s] >= max(g.cores, 1)
                and st_.gpu_mem_free[n, s] >= need[s]
            ]
        if len(ok) >= g.count:
            return True
    return False


pods_strategy = st.lists(
    st.one_of(
        st.builds(lambda k: whole(k), st.integers(1, 4)),
        st.builds(lambda c, m: fraction(c, m), st.integers(0, 100), st.integers(0, 30_000)),
        st.builds(lambda c: PodSpec(cpu_m=c), st.integers(0, 64_000)),
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods=pods_strategy, policy=st.sampled_from(["fairgpu", "kube-default", "Random", "GpuPacking", "DotProd"]))
@example(pods=[whole(4), fraction(100, 15_361)], policy="fairgpu")  # a whole T4 asking 1 MiB more than it has
def test_no_placement_over_commits_a_gpu(pods: list[PodSpec], policy: str) -> None:
    nodes = [gpu_node("big", gpus=4), gpu_node("t4", gpus=2, model="T4", mem_mib=15360, cpu_m=16_000)]
    view, prof = view_of(nodes, policy if policy in ("fairgpu", "kube-default") else "fairgpu")
    if policy not in ("fairgpu", "kube-default"):
        prof = scored([{"name": policy}])
    st_ = view.state
    for i, pod in enumerate(pods):
        p = place(pod, view, prof)
        if p is None:  # nothing was left out that could have been placed
            assert not fits_somewhere(pod, st_), (i, pod)
            continue
        assert len(set(p.slots)) == len(p.slots)  # never two slots of one GPU
        st_.assign(str(i), p)
        assert (st_.gpu_cores_free >= 0).all() and (st_.gpu_mem_free >= 0).all()
        assert (st_.cpu_free >= 0).all() and (st_.mem_free >= 0).all()
    st_.check_invariants()


def test_binpack_spread_and_least_allocated_score_the_fraction_left_free_of_what_the_pod_uses() -> None:
    """n0 (4 GPUs, 64 cores, 256 GiB) runs 2 whole GPUs with 8 cores, 1 GiB; n1 the same size runs a CPU job
    of 48 cores, 128 GiB; n2 has no GPU. A GPU pod is scored by GPU cores alone: Spread 100 · (200 − 20)/400 = 45
    on n0, 95 on n1 (so a spread pod goes to n1, though n1's CPU is the busier); Binpack the rest of 100. A CPU
    pod by CPU and memory, averaged. LeastAllocated by the resources it is given, CPU and memory by default."""
    nodes = [gpu_node(n, gpus=4, cpu_m=64_000, memory_mib=1 << 18) for n in ("n0", "n1")]
    nodes.append(NodeSpec("n2", 64_000, 1 << 18))
    view, prof = view_of(nodes)
    view.state.assign("gpus", view.state.placement_for(whole(2, cpu_m=8_000), 0, (0, 1)))
    view.state.assign("cpus", view.state.placement_for(PodSpec(cpu_m=48_000, memory_mib=1 << 17), 1, ()))
    g, c = fraction(20, 1024), PodSpec(cpu_m=4_000, memory_mib=4_096)

    def scores(plugin: dict, pod: PodSpec) -> list[float]:
        from fairgpu.framework.placement import feasible

        p = scored([plugin])
        return p.score[0][0].score(pod, view, feasible(pod, view, p)).tolist()

    assert scores({"name": "Spread"}, g) == pytest.approx([45.0, 95.0, 0.0])  # n2: nothing of what the pod uses
    assert scores({"name": "Binpack"}, g) == pytest.approx([55.0, 5.0, 100.0])
    # CPU and memory: n0 (52/64 + 257,024/262,144)/2, n1 (12/64 + 126,976/262,144)/2, n2 (60/64 + 258,048/262,144)/2
    assert scores({"name": "Spread"}, c) == pytest.approx([89.6484375, 33.59375, 96.09375])
    assert scores({"name": "Binpack"}, c) == pytest.approx([10.3515625, 66.40625, 3.90625])
    # the GPU pod's 500 m and 512 MiB: n0 (55.5/64 + 260,608/262,144)/2, n1 (15.5/64 + 130,560/262,144)/2,
    # n2 (63.5/64 + 261,632/262,144)/2
    assert scores({"name": "LeastAllocated"}, g) == pytest.approx([93.06640625, 37.01171875, 99.51171875])
    # GPU cores only: a CPU pod takes none; a node without GPUs counts as full, not as a division by 0
    assert scores({"name": "LeastAllocated", "args": {"resources": ["gpu"]}}, c) == pytest.approx([50.0, 100.0, 0.0])
    assert place_pod(replace(g, node_policy="spread"), view, prof).node == 1
