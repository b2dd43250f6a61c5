"""ClusterState: assign/release/fits under HAMi's per-GPU rules, its indexes, and a stateful property test."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from fairgpu.errors import StateError
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec
from fairgpu.state import _ARRAYS, ClusterState, Placement

A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"


def node(
    name: str,
    gpus: int = 4,
    model: str = A100,
    mem: int = 81920,
    *,
    cpu_m: int = 64_000,
    memory_mib: int = 256 * 1024,
    split: int = 10,
    unhealthy: tuple[int, ...] = (),
) -> NodeSpec:
    devices = tuple(GpuDevice(model, mem, f"GPU-{name}-{j}", healthy=j not in unhealthy) for j in range(gpus))
    return NodeSpec(name, cpu_m, memory_mib, devices, split_count=split)


def whole(n: int = 1, cpu_m: int = 1000, memory_mib: int = 1024) -> PodSpec:
    return PodSpec(cpu_m, memory_mib, GpuRequest(n, 100, 0, 100))


def frac(cores: int, mem_mib: int, n: int = 1, cpu_m: int = 500) -> PodSpec:
    return PodSpec(cpu_m, 512, GpuRequest(n, cores, mem_mib))


def snapshot(state: ClusterState) -> dict[str, np.ndarray]:
    return {name: getattr(state, name).copy() for name in _ARRAYS}


def assert_same(state: ClusterState, before: dict[str, np.ndarray]) -> None:
    for name, arr in before.items():
        assert np.array_equal(getattr(state, name), arr), name


def put(state: ClusterState, key: str, pod: PodSpec, node_i: int, slots: tuple[int, ...] = ()) -> Placement:
    p = state.placement_for(pod, node_i, slots)
    state.assign(key, p)
    state.check_invariants()
    return p


def can(state: ClusterState, pod: PodSpec, node_i: int, slots: tuple[int, ...] = ()) -> bool:
    return state.fits(state.placement_for(pod, node_i, slots))


# -- construction and sizes ----------------------------------------------------------------------------------


def test_initial_state_is_all_free() -> None:
    s = ClusterState([node("a", 4, mem=40960, cpu_m=32_000, memory_mib=1000), node("b", 2, model=T4, mem=15360)])
    assert s.num_nodes == 2 and s.total_gpus == 6
    assert s.gpu_valid.shape == (2, 4)
    assert s.gpu_valid[1].tolist() == [True, True, False, False]
    assert s.node_idle_gpus.tolist() == [4, 2]
    assert s.node_cores_free.tolist() == [400, 200]
    assert s.capacity_vector().tolist() == [6.0, 4 * 40960 + 2 * 15360, 32_000 + 64_000, 1000 + 256 * 1024]
    assert s.mean_gpu_memory_mib() == pytest.approx((4 * 40960 + 2 * 15360) / 6)
    assert s.allocated_gpu_equivalents() == 0
    assert s.models == sorted([A100, T4])
    s.check_invariants()


def test_duplicate_node_names_rejected() -> None:
    with pytest.raises(ValueError, match="unique"):
        ClusterState([node("a"), node("a")])


def test_cluster_without_gpus() -> None:
    s = ClusterState([NodeSpec("cpu", 8000, 16384)])
    assert s.total_gpus == 0 and s.mean_gpu_memory_mib() == 0
    put(s, "p", PodSpec(4000, 8192), 0)
    assert not can(s, PodSpec(5000, 1), 0)


def test_model_slots() -> None:
    s = ClusterState([node("a", 2), node("b", 3, model=T4, mem=15360)])
    assert s.model_slots(lambda m: "t4" in m.lower()).tolist() == [[False, False, False], [True, True, True]]
    assert s.model_slots(lambda m: True).tolist() == s.gpu_valid.tolist()


# -- placement_for -------------------------------------------------------------------------------------------


def test_placement_for_whole_gpus_takes_each_cards_memory() -> None:
    devs = (GpuDevice(A100, 81920), GpuDevice("A100-40GB", 40960))
    s = ClusterState([NodeSpec("mixed", 64_000, 1 << 18, devs)])
    p = s.placement_for(whole(2, cpu_m=3000, memory_mib=2048), 0, (1, 0))
    assert p == Placement(0, (1, 0), (100, 100), (40960, 81920), 3000, 2048)


def test_placement_for_fractional_and_percentage() -> None:
    s = ClusterState([node("a", 2, mem=40960)])
    assert s.placement_for(frac(30, 4096), 0, (1,)) == Placement(0, (1,), (30,), (4096,), 500, 512)
    pct = PodSpec(gpu=GpuRequest(2, 20, 0, 25))
    assert s.placement_for(pct, 0, (0, 1)).mem_mib == (10240, 10240)
    assert s.placement_for(PodSpec(100, 200), 0, ()) == Placement(0, (), (), (), 100, 200)


def test_cores_100_with_gpumem_records_its_gpumem_and_still_takes_the_whole_card() -> None:
    """HAMi writes Memreq (1000) for a cores-100 request with gpumem; the card is exclusive by its cores."""
    s = ClusterState([node("a", 1, mem=40960)])
    p = s.placement_for(PodSpec(gpu=GpuRequest(1, 100, 1000)), 0, (0,))
    assert p.mem_mib == (1000,)
    s.assign("x", p)
    assert s.gpu_exclusive[0, 0] and not s.fits(s.placement_for(PodSpec(gpu=GpuRequest(1, 0, 10)), 0, (0,)))


# -- HAMi per-GPU rules ------------------------------------------------------------------------------------


def test_whole_gpu_pod_is_alone_on_its_gpu() -> None:
    s = ClusterState([node("a", 2)])
    put(s, "w", whole(), 0, (0,))
    assert s.gpu_exclusive[0].tolist() == [True, False]
    assert not can(s, frac(0, 1), 0, (0,))  # not even a 0-core, 1-MiB task
    assert not can(s, frac(10, 1000), 0, (0,))
    assert not can(s, whole(), 0, (0,))
    assert can(s, frac(10, 1000), 0, (1,))


def test_whole_gpu_pod_needs_an_idle_gpu() -> None:
    s = ClusterState([node("a", 2)])
    put(s, "tiny", frac(0, 1), 0, (0,))
    assert not can(s, whole(), 0, (0,))
    assert not can(s, whole(2), 0, (0, 1))
    assert can(s, whole(), 0, (1,))
    # Even a 100-core placement that asks for no memory may not join a busy card.
    assert not s.fits(Placement(0, (0,), (100,), (0,)))
    assert s.fits(Placement(0, (1,), (100,), (0,)))


def test_cores_100_fractional_request_needs_an_idle_gpu() -> None:
    s = ClusterState([node("a", 2)])
    pod = PodSpec(gpu=GpuRequest(1, 100, 1000))  # gpucores 100 + gpumem: an exclusive card
    put(s, "small", frac(0, 1000), 0, (0,))
    assert not can(s, pod, 0, (0,))  # 100 cores free and memory to spare, but the card is not idle
    put(s, "excl", pod, 0, (1,))
    assert s.gpu_exclusive[0, 1]
    assert not can(s, frac(0, 1), 0, (1,))


def test_zero_core_request_cannot_land_on_a_card_with_all_cores_taken() -> None:
    s = ClusterState([node("a", 2)])
    put(s, "h1", frac(50, 1000), 0, (0,))
    assert can(s, frac(0, 1000), 0, (0,))  # 50 cores still free
    put(s, "h2", frac(50, 1000), 0, (0,))
    assert s.gpu_cores_free[0, 0] == 0
    assert s.gpu_mem_free[0, 0] == 81920 - 2000
    assert not can(s, frac(0, 1000), 0, (0,))
    assert can(s, frac(0, 1000), 0, (1,))


def test_cores_and_memory_must_fit_per_gpu() -> None:
    s = ClusterState([node("a", 1, mem=40960)])
    put(s, "p", frac(70, 30000), 0, (0,))
    assert not can(s, frac(31, 1000), 0, (0,))
    assert can(s, frac(30, 10960), 0, (0,))
    assert not can(s, frac(30, 10961), 0, (0,))
    assert not can(s, frac(1, 50000), 0, (0,))


def test_split_count_caps_tasks_per_gpu() -> None:
    s = ClusterState([node("a", 1, split=2)])
    put(s, "p1", frac(0, 100), 0, (0,))
    put(s, "p2", frac(0, 100), 0, (0,))
    assert s.gpu_tasks[0, 0] == 2
    assert not can(s, frac(0, 100), 0, (0,))
    s.release("p1")
    assert can(s, frac(0, 100), 0, (0,))


def test_one_container_never_gets_two_slots_of_one_gpu() -> None:
    s = ClusterState([node("a", 2)])
    p = s.placement_for(frac(10, 100, n=2), 0, (0, 0))
    assert not s.fits(p)
    before = snapshot(s)
    with pytest.raises(StateError):
        s.assign("dup", p)
    assert_same(s, before)
    assert s.placed_keys() == []
    put(s, "ok", frac(10, 100, n=2), 0, (0, 1))


def test_multi_gpu_pod_takes_every_listed_slot() -> None:
    s = ClusterState([node("a", 4)])
    put(s, "p", frac(25, 1000, n=3), 0, (0, 2, 3))
    assert s.gpu_cores_free[0].tolist() == [75, 100, 75, 75]
    assert s.gpu_tasks[0].tolist() == [1, 0, 1, 1]
    assert s.allocated_gpu_equivalents() == pytest.approx(0.75)


def test_node_cpu_and_memory_must_fit() -> None:
    s = ClusterState([node("a", 2, cpu_m=4000, memory_mib=8192)])
    put(s, "p", PodSpec(3000, 4096), 0)
    assert not can(s, PodSpec(1001, 1), 0)
    assert not can(s, PodSpec(1, 4097), 0)
    assert not can(s, frac(10, 10, cpu_m=1001), 0, (0,))
    assert can(s, PodSpec(1000, 4096), 0)


def test_unhealthy_and_missing_gpus_never_fit() -> None:
    s = ClusterState([node("a", 2, unhealthy=(1,)), node("b", 4)])
    assert s.node_idle_gpus.tolist() == [1, 4]
    assert not can(s, frac(10, 10), 0, (1,))
    assert not s.fits(Placement(0, (2,), (10,), (10,)))  # padding slot: node a has no third GPU
    assert not s.fits(Placement(0, (7,), (10,), (10,)))  # out of range
    assert not s.fits(Placement(5))  # no such node
    assert not s.fits(Placement(-1))
    assert can(s, frac(10, 10), 0, (0,))


def test_assign_twice_raises_and_changes_nothing() -> None:
    s = ClusterState([node("a", 2)])
    put(s, "p", frac(30, 1000), 0, (0,))
    before = snapshot(s)
    with pytest.raises(StateError, match="already placed"):
        s.assign("p", s.placement_for(frac(30, 1000), 0, (1,)))
    assert_same(s, before)
    assert s.placed_keys() == ["p"]
    assert s.placement("p").slots == (0,)


def test_assign_that_does_not_fit_raises_and_changes_nothing() -> None:
    s = ClusterState([node("a", 1)])
    put(s, "w", whole(), 0, (0,))
    before = snapshot(s)
    with pytest.raises(StateError, match="does not fit"):
        s.assign("x", s.placement_for(frac(10, 10), 0, (0,)))
    assert_same(s, before)
    assert s.placement("x") is None


def test_release_unplaced_raises_and_changes_nothing() -> None:
    s = ClusterState([node("a", 2)])
    put(s, "p", frac(30, 1000), 0, (0,))
    before = snapshot(s)
    with pytest.raises(StateError, match="not placed"):
        s.release("ghost")
    assert_same(s, before)
    s.release("p")
    with pytest.raises(StateError):
        s.release("p")


def test_release_returns_placement_and_restores_everything() -> None:
    s = ClusterState([node("a", 4), node("b", 2, model=T4, mem=15360)])
    initial = snapshot(s)
    placements = {
        "w": put(s, "w", whole(2), 0, (1, 3)),
        "f": put(s, "f", frac(30, 5000), 1, (0,)),
        "g": put(s, "g", frac(0, 5000), 1, (0,)),
        "c": put(s, "c", PodSpec(2000, 4096), 1),
    }
    assert sorted(s.placed_keys()) == sorted(placements)
    for key in ["f", "w", "c", "g"]:
        assert s.release(key) == placements[key]
        s.check_invariants()
    assert_same(s, initial)


def test_idle_and_core_indexes_stay_current() -> None:
    s = ClusterState([node("a", 4), node("b", 2)])
    put(s, "f1", frac(30, 1000), 0, (0,))
    assert s.node_idle_gpus.tolist() == [3, 2]
    assert s.node_cores_free.tolist() == [370, 200]
    put(s, "f2", frac(20, 1000), 0, (0,))  # same card: no longer idle already
    assert s.node_idle_gpus.tolist() == [3, 2]
    assert s.node_cores_free.tolist() == [350, 200]
    put(s, "w", whole(2), 1, (0, 1))
    assert s.node_idle_gpus.tolist() == [3, 0]
    assert s.node_cores_free.tolist() == [350, 0]
    put(s, "z", frac(0, 1000), 0, (1,))  # a 0-core task still makes the card busy
    assert s.node_idle_gpus.tolist() == [2, 0]
    assert s.node_cores_free.tolist() == [350, 0]
    s.release("f1")
    assert s.node_idle_gpus.tolist() == [2, 0]  # f2 still holds card 0
    s.release("f2")
    assert s.node_idle_gpus.tolist() == [3, 0]
    assert s.gpu_idle[0].tolist() == [True, False, True, True]
    s.release("w")
    assert s.node_idle_gpus.tolist() == [3, 2]
    assert s.node_cores_free.tolist() == [400, 200]
    assert not s.gpu_exclusive.any()
    s.check_invariants()


def test_check_invariants_detects_corruption() -> None:
    s = ClusterState([node("a", 2)])
    put(s, "p", frac(30, 1000), 0, (0,))
    s.gpu_cores_free[0, 0] += 1
    with pytest.raises(StateError, match="free GPU cores"):
        s.check_invariants()
    s.gpu_cores_free[0, 0] -= 1
    s.node_idle_gpus[0] += 1
    with pytest.raises(StateError, match="idle"):
        s.check_invariants()


# -- unplaceable_reason --------------------------------------------------------------------------------------


def test_unplaceable_reason_none_when_some_node_could_hold_it() -> None:
    s = ClusterState([node("a", 2, mem=40960), node("b", 8, model=T4, mem=15360)])
    assert s.unplaceable_reason(PodSpec(1000, 1024)) is None
    assert s.unplaceable_reason(whole(8)) is None
    assert s.unplaceable_reason(frac(30, 40000)) is None
    assert s.unplaceable_reason(PodSpec(gpu=GpuRequest(2, 0, 0, 50), gpu_include=("a100",))) is None


def test_unplaceable_reason_messages() -> None:
    s = ClusterState([node("a", 2, mem=40960, cpu_m=8000, memory_mib=16384), node("b", 4, model=T4, mem=15360)])
    assert s.unplaceable_reason(PodSpec(cpu_m=999_000)) == "cpu request 999000m is more than any node has"
    assert s.unplaceable_reason(PodSpec(memory_mib=10**9)) == (f"memory request {10**9}Mi is more than any node has")
    no_model = PodSpec(gpu=GpuRequest(1, 100, 0), gpu_include=("h100",))
    assert s.unplaceable_reason(no_model) == "no GPU in the cluster is of an allowed model"
    excluded = PodSpec(gpu=GpuRequest(1, 100, 0), gpu_exclude=("a100", "t4"))
    assert s.unplaceable_reason(excluded) == "no GPU in the cluster is of an allowed model"
    assert s.unplaceable_reason(whole(5)) == "nvidia.com/gpu 5 is more than any node has"
    assert s.unplaceable_reason(frac(10, 50000)) == (
        "nvidia.com/gpu 1 with nvidia.com/gpumem 50000 MiB each is more than any node has"
    )
    a100_only = PodSpec(gpu=GpuRequest(3, 100, 0), gpu_include=("A100",))
    assert s.unplaceable_reason(a100_only) == "nvidia.com/gpu 3 is more than any node has"
    big_mem = PodSpec(gpu=GpuRequest(2, 10, 20000))  # only node a's cards have 20000 MiB
    assert s.unplaceable_reason(big_mem) is None
    assert s.unplaceable_reason(PodSpec(gpu=GpuRequest(3, 10, 20000))) is not None


def test_unplaceable_reason_needs_one_node_with_everything() -> None:
    # CPU on one node, GPUs on another: no node can hold both.
    s = ClusterState([node("gpus", 8, cpu_m=1000), NodeSpec("cpus", 128_000, 1 << 20)])
    assert s.unplaceable_reason(whole(1, cpu_m=2000)) is not None
    assert s.unplaceable_reason(whole(1, cpu_m=1000)) is None


def test_unplaceable_reason_ignores_current_usage() -> None:
    s = ClusterState([node("a", 1)])
    put(s, "w", whole(), 0, (0,))
    assert s.unplaceable_reason(whole()) is None


# -- stateful property test ------------------------------------------------------------------------------------

GPU_MEMS = (1000, 2000, 4000)


@st.composite
def clusters(draw: st.DrawFn) -> list[NodeSpec]:
    nodes = []
    for i in range(draw(st.integers(1, 2))):
        devs = tuple(
            GpuDevice(
                draw(st.sampled_from(["A", "B"])),
                draw(st.sampled_from(GPU_MEMS)),
                healthy=draw(st.sampled_from([True, True, True, False])),
            )
            for _ in range(draw(st.integers(0, 3)))
        )
        cpu = draw(st.sampled_from([2000, 4000, 8000]))
        mem = draw(st.sampled_from([2048, 8192]))
        nodes.append(NodeSpec(f"n{i}", cpu, mem, devs, split_count=draw(st.sampled_from([1, 2, 4, 10]))))
    return nodes


gpu_requests = st.builds(
    GpuRequest,
    count=st.integers(1, 3),
    cores=st.sampled_from([0, 0, 10, 25, 50, 50, 100]),
    mem_mib=st.sampled_from([0, 100, 100, 500, 1000, 2500]),
    mem_pct=st.sampled_from([10, 50, 100]),
)
pods = st.builds(
    PodSpec,
    cpu_m=st.sampled_from([0, 250, 1000, 3000]),
    memory_mib=st.sampled_from([0, 256, 2048]),
    gpu=st.one_of(st.none(), gpu_requests, gpu_requests, gpu_requests),
)


class ClusterMachine(RuleBasedStateMachine):
    """Random assign/release sequences, checked against an independent model of HAMi's rules."""

    def __init__(self) -> None:
        super().__init__()
        self.placed: dict[str, Placement] = {}
        self.counter = 0

    @initialize(nodes=clusters())
    def build(self, nodes: list[NodeSpec]) -> None:
        self.specs = nodes
        self.state = ClusterState(nodes)
        self.initial = snapshot(self.state)
        self.width = self.state.gpu_valid.shape[1]

    # -- an independent oracle, computed from our own ledger and the NodeSpecs ------------------------------
    def usage(self) -> tuple[dict, dict, dict, dict]:
        tasks: dict = defaultdict(int)
        cores: dict = defaultdict(int)
        mem: dict = defaultdict(int)
        excl: dict = defaultdict(bool)
        for p in self.placed.values():
            for s, c, m in zip(p.slots, p.cores, p.mem_mib, strict=True):
                tasks[p.node, s] += 1
                cores[p.node, s] += c
                mem[p.node, s] += m
                excl[p.node, s] |= c >= 100
        return tasks, cores, mem, excl

    def oracle_fits(self, p: Placement) -> bool:
        nd = self.specs[p.node]
        used_cpu = sum(q.cpu_m for q in self.placed.values() if q.node == p.node)
        used_mem = sum(q.memory_mib for q in self.placed.values() if q.node == p.node)
        if used_cpu + p.cpu_m > nd.cpu_m or used_mem + p.memory_mib > nd.memory_mib:
            return False
        if len(set(p.slots)) < len(p.slots):
            return False
        tasks, cores, mem, excl = self.usage()
        for s, c, m in zip(p.slots, p.cores, p.mem_mib, strict=True):
            if s >= len(nd.gpus) or not nd.gpus[s].healthy:
                return False
            key = (p.node, s)
            if excl[key] or tasks[key] >= nd.split_count:
                return False
            if cores[key] + c > 100 or mem[key] + m > nd.gpus[s].memory_mib:
                return False
            if c >= 100 and tasks[key] > 0:
                return False
            if c == 0 and cores[key] >= 100:
                return False
        return True

    def attempt(self, pod: PodSpec, node_i: int, slots: tuple[int, ...]) -> None:
        p = self.state.placement_for(pod, node_i, slots)
        fits = self.state.fits(p)
        assert fits == self.oracle_fits(p), p
        event("assign fits" if fits else "assign rejected")
        key = f"p{self.counter}"
        self.counter += 1
        if fits:
            self.state.assign(key, p)
            self.placed[key] = p
        else:
            before = snapshot(self.state)
            with pytest.raises(StateError):
                self.state.assign(key, p)
            assert_same(self.state, before)

    @rule(pod=pods, data=st.data())
    def try_assign(self, pod: PodSpec, data: st.DataObject) -> None:
        node_i = data.draw(st.integers(0, self.state.num_nodes - 1), label="node")
        slots: tuple[int, ...] = ()
        if pod.gpu is not None:
            if self.width == 0:
                return
            n = pod.gpu.count
            slots = tuple(data.draw(st.lists(st.integers(0, self.width - 1), min_size=n, max_size=n)))
        self.attempt(pod, node_i, slots)

    @precondition(lambda self: any(p.slots for p in self.placed.values()))
    @rule(gpu=gpu_requests, data=st.data())
    def try_stack_on_busy_gpu(self, gpu: GpuRequest, data: st.DataObject) -> None:
        """A one-GPU pod aimed at a card that already holds something: where sharing rules bite."""
        busy = sorted({(p.node, s) for p in self.placed.values() for s in p.slots})
        node_i, slot = data.draw(st.sampled_from(busy), label="busy gpu")
        self.attempt(PodSpec(gpu=GpuRequest(1, gpu.cores, gpu.mem_mib, gpu.mem_pct)), node_i, (slot,))

    @precondition(lambda self: bool(self.placed))
    @rule(data=st.data())
    def release_one(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.placed)), label="key")
        assert self.state.release(key) == self.placed.pop(key)

    @precondition(lambda self: bool(self.placed))
    @rule(data=st.data())
    def assign_placed_key_again(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.placed)), label="key")
        before = snapshot(self.state)
        with pytest.raises(StateError):
            self.state.assign(key, Placement(self.placed[key].node))
        assert_same(self.state, before)

    @rule()
    def release_unknown(self) -> None:
        before = snapshot(self.state)
        with pytest.raises(StateError):
            self.state.release("never-placed")
        assert_same(self.state, before)

    @precondition(lambda self: len(self.placed) >= 4)
    @rule()
    def release_all(self) -> None:
        for key in list(self.placed):
            self.state.release(key)
            del self.placed[key]
            self.state.check_invariants()
        assert self.state.placed_keys() == []
        assert_same(self.state, self.initial)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "state"):
            return
        s = self.state
        s.check_invariants()
        assert sorted(s.placed_keys()) == sorted(self.placed)
        assert (s.cpu_free >= 0).all() and (s.mem_free >= 0).all()
        assert (s.gpu_cores_free >= 0).all() and (s.gpu_mem_free >= 0).all()
        tasks, cores, mem, excl = self.usage()
        for (i, j), is_excl in excl.items():
            if is_excl:
                assert tasks[i, j] == 1, "a whole-GPU pod shares its card"
        for (i, j), n in tasks.items():
            assert n <= self.specs[i].split_count
            assert s.gpu_cores_free[i, j] == 100 - cores[i, j]
            assert s.gpu_mem_free[i, j] == self.specs[i].gpus[j].memory_mib - mem[i, j]
        for i, nd in enumerate(self.specs):
            idle = sum(1 for j, d in enumerate(nd.gpus) if d.healthy and tasks[i, j] == 0)
            assert s.node_idle_gpus[i] == idle
            assert s.node_cores_free[i] == 100 * len(nd.gpus) - sum(cores[i, j] for j in range(len(nd.gpus)))

    def teardown(self) -> None:
        if hasattr(self, "state"):
            self.release_all()


ClusterMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestClusterMachine = ClusterMachine.TestCase


# -- dry runs in place ----------------------------------------------------------------------------------------


def test_dry_run_frees_in_place_nests_and_leaves_everything_as_it_was() -> None:
    from fairgpu.state import Footprint

    state = ClusterState([node("n0"), node("n1"), node("n2")])
    a = put(state, "a", whole(2), 0, (0, 1))
    put(state, "b", frac(30, 1000), 1, (2,))
    c = put(state, "c", frac(50, 2000), 1, (2,))
    before, ledger, mark = snapshot(state), dict(state._ledger), state.version
    freed = Footprint.from_rows(
        [(a.node, a.cpu_m, a.memory_mib, 0), (c.node, c.cpu_m, c.memory_mib, 1)],
        [(a.node, 0, 100, a.mem_mib[0], -1, 0), (a.node, 1, 100, a.mem_mib[1], -1, 0), (c.node, 2, 50, 2000, -1, 1)],
    )
    copy = state.without(freed)
    with pytest.raises(RuntimeError), state.dry_run(freed) as dry:
        assert dry is state
        for name in _ARRAYS:  # the very arrays a copy with the footprint freed has
            assert np.array_equal(getattr(state, name), getattr(copy, name)), name
        assert state.gpu_idle[0, :2].all() and state.node_idle_gpus[0] == 4
        put(state, "\0dry", whole(4), 0, (0, 1, 2, 3))  # the freed GPUs can be taken in the dry run
        with state.dry_run() as inner:
            inner.release("b")
            put(inner, "\0inner", frac(100, 1000), 1, (2,))
            raise RuntimeError("a dry run that fails still undoes itself")
    assert_same(state, before)
    assert state._ledger == ledger
    state.check_invariants()
    # The touched nodes are listed as changed, so caches recompute them; node 2 was never touched.
    assert state.changes.since(mark).tolist() == [0, 1]
    assert not state._journals


def test_a_copy_made_in_a_dry_run_is_independent_of_it() -> None:
    state = ClusterState([node("n0"), node("n1")])
    with state.dry_run():
        put(state, "\0x", whole(1), 0, (0,))
        copy = state.copy()
    assert copy.placement("\0x") is not None and state.placement("\0x") is None
    put(copy, "y", whole(1), 1, (0,))  # no journal of the original's follows the copy
    assert not copy._journals and state.gpu_idle[1, 0]


def test_changes_list_each_changed_node_once_and_every_node_once_the_log_forgot() -> None:
    state = ClusterState([node(f"n{i}") for i in range(4)])
    start = state.version
    put(state, "a", whole(1), 2, (0,))
    mark = state.version
    put(state, "b", whole(1), 0, (0,))
    state.release("a")
    put(state, "c", frac(30, 1000), 2, (1,))
    assert state.changes.since(start).tolist() == [0, 2]
    assert state.changes.since(mark).tolist() == [0, 2] and state.changes.since(state.version).size == 0
    copy = state.copy()  # its own log, from where the original's is
    put(copy, "d", whole(1), 3, (0,))
    assert copy.changes.since(mark).tolist() == [0, 1, 2, 3] and state.changes.since(mark).tolist() == [0, 2]
    # a long run of changes on one node: the log keeps only the recent part, and a cache that saw the state
    # before that part recomputes every node rather than miss one
    for i in range(3000):
        state.release("b") if i % 2 == 0 else put(state, "b", whole(1), 0, (0,))
    recent = state.version - 10
    assert state.changes.since(mark).tolist() == [0, 1, 2, 3]
    assert state.changes.since(recent).tolist() == [0]


def test_a_mark_asked_again_after_as_many_changes_as_the_log_holds_is_answered_anew() -> None:
    """since() keeps its answers until the log's end moves: after 2048 changes (the log of a small cluster
    holds that many, and forgot the older half on the way) the cache that asked at `mark` must see that every
    node may have changed, not the empty answer it was given before (a filter cache would then keep a node
    it no longer fits on)."""
    from fairgpu.changes import Changes

    log = Changes(3)
    log.add(0)
    mark = log.end
    assert log.since(mark).size == 0
    for _ in range(2048):
        log.add(2)
    assert log.since(mark).tolist() == [0, 1, 2]  # the log no longer reaches back to `mark`
    assert log.since(log.end - 1).tolist() == [2]


def test_a_change_log_lists_what_changed_after_each_mark_whatever_it_kept() -> None:
    from fairgpu.changes import Changes

    log = Changes(3000)
    rng = np.random.default_rng(0)
    marks: list[tuple[int, set[int]]] = []  # (mark, nodes changed since), checked against the log
    for _ in range(400):
        nodes = rng.integers(0, 3000, size=int(rng.choice([1, 1, 5, 90, 700])))
        marks.append((log.end, set()))
        if rng.random() < 0.5:
            for n in nodes.tolist():
                log.add(n)
        else:
            log.extend(nodes)
        for _, seen in marks:
            seen.update(nodes.tolist())
        # asked between changes too: since() keeps its answers until the log moves, and one kept past a
        # change would miss it when the same mark is asked again
        mark, seen = marks[int(rng.integers(len(marks)))]
        got = log.since(mark).tolist()
        assert got == sorted(seen) or got == list(range(3000)), mark
    kept = [(m, s) for m, s in marks if log.since(m).size < 3000]
    assert len(kept) > 20  # the recent marks are answered from the log, not by "every node"
    for mark, seen in marks:
        got = log.since(mark).tolist()
        assert got == sorted(seen) or got == list(range(3000)), mark
    assert all(log.since(m).tolist() == sorted(s) for m, s in marks[-20:])
    log.extend(np.zeros(20_000, dtype=np.int64))  # more than it keeps: every earlier mark sees every node
    assert log.since(marks[-1][0]).size == 3000 and log.since(log.end).size == 0
