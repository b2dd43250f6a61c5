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


# -- fairness.py ---------------------------------------------------------------------------------------------------


def _v(gpu: float, cpu: float = 0.0) -> np.ndarray:
    return np.array([gpu, 0.0, cpu, 0.0])


def _entitled(queues: list[QueueSpec], demand: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """Entitled (GPUs, cores) of every queue on a cluster of 10 GPUs and 100 cores."""
    from fairgpu.fairness import entitlements

    t = QueueTree(queues)
    d = np.zeros((len(t), 4))
    for name, v in demand.items():
        d[t.index[name]] = v
    ent = entitlements(t, _v(10, 100), d)
    return {name: [round(float(ent[t.index[name], i]), 4) for i in (0, 2)] for name in t.names()}


def test_a_guarantee_below_the_fair_share_is_a_floor_not_a_claim_on_the_whole_cluster():
    """a (weight 1) is guaranteed 2 of 10 GPUs, b (weight 3) nothing; both want everything. a gets its 2
    first, the other 8 go 1:3: a 4, b 6 — not a's whole demand because it holds a guarantee."""
    queues = [QueueSpec("a", 1.0, _v(2, np.inf)), QueueSpec("b", 3.0)]
    assert _entitled(queues, {"a": _v(10, 10), "b": _v(10, 50)}) == {"a": [4.0, 4.0], "b": [6.0, 30.0]}


def test_a_lone_queue_is_entitled_to_its_whole_demand():
    assert _entitled([QueueSpec("solo")], {"solo": _v(3, 30)}) == {"solo": [3.0, 30.0]}


def test_a_teams_guarantee_holds_under_an_org_that_has_none():
    """t1 is guaranteed 4 GPUs inside org, which has no guarantee of its own; org and o2 weigh the same, t2
    weighs 3 × t1. t1 gets its 4 first, then the other 6 GPUs go 1:1 between the orgs (org 7, o2 3) and org's
    extra 3 go 1:3 between its teams. Without the guarantee t1 would get 1.25."""
    queues = [
        QueueSpec("org"),
        QueueSpec("t1", 1.0, _v(4, np.inf), parent="org"),
        QueueSpec("t2", 3.0, parent="org"),
        QueueSpec("o2"),
    ]
    got = _entitled(queues, {"t1": _v(10, 10), "t2": _v(10, 10), "o2": _v(10, 10)})
    assert got == {"org": [7.0, 7.0], "t1": [4.75, 4.75], "t2": [2.25, 2.25], "o2": [3.0, 3.0]}


def test_a_subtree_of_mixed_demands_grows_no_faster_than_its_weight():
    """Two equal roots. r1's demand comes through a middle queue from a GPU-heavy and a CPU-heavy team, so
    its growth, summed over both, is dominant in neither resource; r2 wants both alike. Each root still
    ends at the same dominant share, half the cluster: r2 gets 5 GPUs and 50 cores, r1 as much."""
    queues = [QueueSpec("r1"), QueueSpec("m", parent="r1"), QueueSpec("x", parent="m"), QueueSpec("y", parent="m")]
    got = _entitled([*queues, QueueSpec("r2")], {"x": _v(10, 10), "y": _v(1, 100), "r2": _v(10, 100)})
    assert got["r1"] == got["r2"] == [5.0, 50.0]
    assert got["x"][0] > 4 * got["y"][0] and got["y"][1] > 4 * got["x"][1]  # each team along its own mix


def test_a_parent_limit_caps_its_childrens_guarantees_together():
    """org may hold at most 6 GPUs; its two teams are guaranteed 4 each. Their guarantees come first but
    stop at org's limit, 3 each, and o2 gets the other 4 — not 2, as it would if the guarantees overrode the
    limit."""
    limit = np.array([6, np.inf, np.inf, np.inf])
    queues = [
        QueueSpec("org", 1.0, limit=limit),
        QueueSpec("t1", 1.0, _v(4, np.inf), parent="org"),
        QueueSpec("t2", 1.0, _v(4, np.inf), parent="org"),
        QueueSpec("o2"),
    ]
    got = _entitled(queues, {"t1": _v(10, 10), "t2": _v(10, 10), "o2": _v(10, 10)})
    assert got == {"org": [6.0, 6.0], "t1": [3.0, 3.0], "t2": [3.0, 3.0], "o2": [4.0, 4.0]}


def test_a_guarantee_of_a_single_gpu_counts():
    """a is guaranteed exactly 1 GPU (and nothing else) and weighs 1 against b's 19: by weight alone it would
    get half a GPU; it gets its 1 first and 1/20 of the other 9."""
    queues = [QueueSpec("a", 1.0, _v(1)), QueueSpec("b", 19.0)]
    assert _entitled(queues, {"a": _v(3), "b": _v(10)}) == {"a": [1.45, 0.0], "b": [8.55, 0.0]}


def test_a_limit_holds_when_it_binds_after_another_queue_is_satisfied():
    """a may hold 4 GPUs; b wants 1, c everything. All three grow alike until b has its 1 (a holds 1 by then);
    then a reaches its limit from there, at 4, and c takes the rest: 5."""
    queues = [QueueSpec("a", 1.0, limit=np.array([4, np.inf, np.inf, np.inf])), QueueSpec("b"), QueueSpec("c")]
    got = _entitled(queues, {"a": _v(10), "b": _v(1), "c": _v(10)})
    assert got == {"a": [4.0, 0.0], "b": [1.0, 0.0], "c": [5.0, 0.0]}
