"""Plain data: HAMi defaults for GPU requests, pods' fair charge and model filters, workloads, queue trees."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fairgpu import resources as r
from fairgpu.errors import RequestError
from fairgpu.model import GpuRequest, PodSpec, QueueSpec, QueueTree, Workload, gpu_request

FAST = settings(max_examples=150, deadline=None)

# -- gpu_request: HAMi defaults (design/hami-interop.md §1.2) -----------------------------------------------


def test_no_gpu_resources_means_no_gpu_request() -> None:
    assert gpu_request({}) is None
    assert gpu_request({r.CPU: "1", r.MEMORY: "1Gi"}) is None


@pytest.mark.parametrize("n", [1, 2, 8])
def test_gpu_alone_is_whole_exclusive_cards(n: int) -> None:
    g = gpu_request({r.GPU: str(n)})
    assert g == GpuRequest(count=n, cores=100, mem_mib=0, mem_pct=100)
    assert g.exclusive
    assert g.mem_for(81920) == 81920
    assert g.gpu_equivalents() == n


def test_gpumem_alone_implies_one_gpu_and_no_cores() -> None:
    g = gpu_request({r.GPUMEM: "4096"})
    assert g == GpuRequest(count=1, cores=0, mem_mib=4096, mem_pct=100)
    assert not g.exclusive
    assert g.mem_for(81920) == 4096
    assert g.gpu_equivalents() == 0


def test_gpumem_is_the_quantitys_plain_value_in_mib_as_hami_reads_it() -> None:
    """HAMi's GenerateResourceRequests takes gpumem's Quantity.AsInt64 as MiB: "1Gi" asks for 1073741824 MiB
    (it fits no card), "8Gi" overflows int32 and HAMi drops the request, which fairgpu refuses."""
    assert gpu_request({r.GPUMEM: "1Gi"}).mem_mib == 1073741824
    assert gpu_request({r.GPUMEM: "1k"}).mem_mib == 1000
    with pytest.raises(RequestError, match=re.escape(r.GPUMEM)):
        gpu_request({r.GPUMEM: "8Gi"})


def test_gpucores_alone_implies_one_gpu_and_all_memory() -> None:
    g = gpu_request({r.GPUCORES: "30"})
    assert g == GpuRequest(count=1, cores=30, mem_mib=0, mem_pct=100)
    assert not g.exclusive
    assert g.mem_for(40960) == 40960
    assert g.gpu_equivalents() == pytest.approx(0.3)


def test_gpu_with_gpumem_gets_no_exclusivity() -> None:
    g = gpu_request({r.GPU: "2", r.GPUMEM: "1000"})
    assert g == GpuRequest(count=2, cores=0, mem_mib=1000, mem_pct=100)
    assert not g.exclusive


def test_gpumem_percentage_100_without_cores_is_exclusive() -> None:
    g = gpu_request({r.GPU: "1", r.GPUMEM_PCT: "100"})
    assert g.cores == 100 and g.exclusive
    assert gpu_request({r.GPUMEM_PCT: "100"}) == GpuRequest(1, 100, 0, 100)


def test_gpumem_percentage_100_with_explicit_cores_keeps_cores() -> None:
    assert gpu_request({r.GPU: "1", r.GPUMEM_PCT: "100", r.GPUCORES: "0"}) == GpuRequest(1, 0, 0, 100)
    assert gpu_request({r.GPU: "1", r.GPUMEM_PCT: "100", r.GPUCORES: "40"}) == GpuRequest(1, 40, 0, 100)


def test_gpumem_percentage_below_100_is_shared() -> None:
    g = gpu_request({r.GPU: "2", r.GPUMEM_PCT: "50", r.GPUCORES: "30"})  # HAMi's use_memory_fraction example
    assert g == GpuRequest(count=2, cores=30, mem_mib=0, mem_pct=50)
    assert g.mem_for(32768) == 16384
    assert g.mem_for(np.array([32768, 81920])).tolist() == [16384, 40960]
    g = gpu_request({r.GPUMEM_PCT: "25"})
    assert (g.count, g.cores, g.mem_pct) == (1, 0, 25)


def test_explicit_gpumem_wins_over_percentage() -> None:
    g = gpu_request({r.GPU: "1", r.GPUMEM: "2048", r.GPUMEM_PCT: "50"})
    assert g.mem_mib == 2048
    assert g.mem_for(81920) == 2048


@pytest.mark.parametrize("pct", ["0", "-5"])
def test_gpumem_percentage_at_most_zero_means_all_memory(pct: str) -> None:
    g = gpu_request({r.GPU: "1", r.GPUCORES: "20", r.GPUMEM_PCT: pct})
    assert g.mem_pct == 100
    assert g.mem_for(24576) == 24576


def test_gpumem_zero_means_all_memory() -> None:
    g = gpu_request({r.GPU: "1", r.GPUCORES: "20", r.GPUMEM: "0"})
    assert g.mem_mib == 0 and g.mem_pct == 100
    assert g.mem_for(24576) == 24576


def test_gpucores_100_is_exclusive() -> None:
    assert gpu_request({r.GPUCORES: "100", r.GPUMEM: "1000"}).exclusive


def test_zero_gpus_is_no_request() -> None:
    assert gpu_request({r.GPU: "0"}) is None
    assert gpu_request({r.GPU: "0", r.GPUCORES: "0"}) is None


def test_zero_gpus_with_cores_or_memory_is_no_request() -> None:
    assert gpu_request({r.GPU: "0", r.GPUMEM: "1000"}) is None  # HAMi's Resourcereqs skips Nums 0
    assert gpu_request({r.GPU: "0", r.GPUCORES: "10"}) is None


@pytest.mark.parametrize("cores", ["101", "150", "1k"])
def test_cores_over_100_are_clamped_to_100(cores: str) -> None:
    assert gpu_request({r.GPU: "1", r.GPUCORES: cores}).cores == 100  # Fit's clamp, written to the annotation


@pytest.mark.parametrize("pct", ["101", "200"])
def test_memory_percentage_over_100_is_clamped(pct: str) -> None:
    assert gpu_request({r.GPU: "1", r.GPUMEM_PCT: pct, r.GPUCORES: "10"}).mem_pct == 100


@pytest.mark.parametrize(
    "bad",
    [{r.GPU: "1.5"}, {r.GPU: "-1"}, {r.GPUMEM: "1.5"}, {r.GPUMEM: "-1"}, {r.GPU: "x"}, {r.GPUMEM_PCT: "lots"}],
)
def test_malformed_quantities_become_request_errors(bad: dict) -> None:
    with pytest.raises(RequestError):
        gpu_request(bad)


def test_request_error_is_a_value_error() -> None:
    assert issubclass(RequestError, ValueError)


@FAST
@example(gpus=None, cores=None, mem=1, pct=100)  # HAMi's defaultExclusiveCoreIfNeeded: pct 100 wins over gpumem
@given(
    gpus=st.one_of(st.none(), st.integers(1, 8)),
    cores=st.one_of(st.none(), st.integers(0, 100)),
    mem=st.one_of(st.none(), st.integers(0, 80000)),
    pct=st.one_of(st.none(), st.integers(0, 100)),
)
def test_gpu_request_defaults_are_consistent(
    gpus: int | None, cores: int | None, mem: int | None, pct: int | None
) -> None:
    spec = {
        k: str(v)
        for k, v in [(r.GPU, gpus), (r.GPUCORES, cores), (r.GPUMEM, mem), (r.GPUMEM_PCT, pct)]
        if v is not None
    }
    g = gpu_request(spec)
    if not spec:
        assert g is None
        return
    assert g.count == (gpus if gpus is not None else 1)
    assert 0 <= g.cores <= 100 and 1 <= g.mem_pct <= 100 and g.mem_mib >= 0
    if cores is not None:
        assert g.cores == cores  # an explicit core request is never rewritten
    elif mem and pct != 100:
        assert g.cores == 0  # a memory-sized share gets no exclusivity (a 100 % percentage still does, as in HAMi)
    if mem:
        assert g.mem_mib == mem and g.mem_for(100_000) == mem
    elif pct:
        assert g.mem_pct == pct and g.mem_for(100_000) == 100_000 * pct // 100
    else:
        assert g.mem_for(100_000) == 100_000
    if cores is None and (pct == 100 if pct is not None else mem is None):
        assert g.exclusive  # gpu-only or 100 %-memory requests take whole cards (HAMi's webhook)
    elif cores is None:
        assert g.cores == 0  # gpumem given (0 included) or a percentage below 100: defaultCores


# -- PodSpec ----------------------------------------------------------------------------------------------


def test_charge_of_cpu_only_pod() -> None:
    pod = PodSpec(cpu_m=1500, memory_mib=2048)
    assert pod.charge(81920).tolist() == [0.0, 0.0, 1500.0, 2048.0]


def test_charge_of_whole_gpu_pod_uses_mean_gpu_memory() -> None:
    pod = PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(2, 100, 0, 100))
    assert pod.charge(40000.0).tolist() == [2.0, 80000.0, 1000.0, 1024.0]


def test_charge_of_fractional_pod() -> None:
    pod = PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 30, 4096))
    assert pod.charge(81920).tolist() == pytest.approx([0.3, 4096.0, 500.0, 512.0])
    pod = PodSpec(gpu=GpuRequest(2, 50, 0, 25))  # 25 % of the mean card's memory, on each of 2 cards
    assert pod.charge(40000.0).tolist() == pytest.approx([1.0, 20000.0, 0.0, 0.0])


def test_charge_dimensions_follow_fair_dims() -> None:
    pod = PodSpec(cpu_m=1, memory_mib=2, gpu=GpuRequest(1, 100, 3))
    vec = pod.charge(10)
    assert vec[r.DIM_GPU] == 1 and vec[r.DIM_GPUMEM] == 3 and vec[r.DIM_CPU] == 1 and vec[r.DIM_MEMORY] == 2


def test_allows_model_without_filters() -> None:
    assert PodSpec().allows_model("NVIDIA A100-SXM4-80GB")


def test_allows_model_include_is_case_insensitive_substring() -> None:
    pod = PodSpec(gpu_include=("a100",))
    assert pod.allows_model("NVIDIA A100-SXM4-80GB")
    assert pod.allows_model("NVIDIA-NVIDIA A100")
    assert not pod.allows_model("NVIDIA H100 80GB HBM3")
    pod = PodSpec(gpu_include=("V100", "h100"))
    assert pod.allows_model("Tesla v100-PCIE-32GB") and pod.allows_model("NVIDIA H100")
    assert not pod.allows_model("NVIDIA A30")


def test_allows_model_exclude_is_case_insensitive_substring() -> None:
    pod = PodSpec(gpu_exclude=("T4",))
    assert not pod.allows_model("Tesla t4")
    assert pod.allows_model("NVIDIA A100")


def test_allows_model_exclude_beats_include() -> None:
    pod = PodSpec(gpu_include=("a100",), gpu_exclude=("40gb",))
    assert pod.allows_model("A100-SXM4-80GB")
    assert not pod.allows_model("A100-PCIE-40GB")


def test_pods_with_identical_requests_share_a_key() -> None:
    a = PodSpec(1000, 1024, GpuRequest(1, 30, 4096), ("a100",))
    b = PodSpec(1000, 1024, GpuRequest(1, 30, 4096), ("a100",))
    assert a.key() == b.key()
    assert a.key() != PodSpec(1000, 1024, GpuRequest(1, 30, 4096)).key()
    assert a.key() != PodSpec(1000, 1024, GpuRequest(1, 31, 4096), ("a100",)).key()


# -- Workload --------------------------------------------------------------------------------------------


def test_workload_names_its_pods_and_knows_gangs() -> None:
    w = Workload("train", "team-a", (PodSpec(), PodSpec()))
    assert w.pod_names == ("train-0", "train-1")
    assert w.gang
    assert not Workload("one", "team-a", (PodSpec(),)).gang


def test_workload_keeps_given_pod_names() -> None:
    assert Workload("w", "q", (PodSpec(),), pod_names=("w-abc",)).pod_names == ("w-abc",)


def test_workload_without_pods_rejected() -> None:
    with pytest.raises(RequestError, match="at least one pod"):
        Workload("empty", "q", ())


# -- QueueTree ----------------------------------------------------------------------------------------------


def test_queue_tree_puts_parents_before_children() -> None:
    tree = QueueTree(
        [
            QueueSpec("leaf-a1", parent="a"),
            QueueSpec("leaf-b", parent="b"),
            QueueSpec("a"),
            QueueSpec("leaf-a2", parent="a"),
            QueueSpec("b", weight=2),
            QueueSpec("deep", parent="leaf-a1"),
        ]
    )
    names = tree.names()
    assert sorted(names) == sorted(["a", "b", "leaf-a1", "leaf-a2", "leaf-b", "deep"])
    for i, p in enumerate(tree.parent):
        assert p < i
    assert [names[i] for i in tree.roots] == ["a", "b"]
    assert sorted(tree.leaf_names()) == ["deep", "leaf-a2", "leaf-b"]
    a, b = tree.index["a"], tree.index["b"]
    assert sorted(names[c] for c in tree.children[a]) == ["leaf-a1", "leaf-a2"]
    assert [names[c] for c in tree.children[b]] == ["leaf-b"]
    assert tree.parent[tree.index["deep"]] == tree.index["leaf-a1"]
    assert tree.weight[b] == 2
    assert tree.is_leaf.tolist() == [not c for c in tree.children]
    assert len(tree) == 6


def test_queue_tree_arrays_follow_the_order() -> None:
    g = np.array([1.0, 2.0, 3.0, 4.0])
    lim = np.array([5.0, np.inf, np.inf, np.inf])
    tree = QueueTree([QueueSpec("child", 3.0, g, lim, parent="root"), QueueSpec("root")])
    c = tree.index["child"]
    assert tree.names() == ["root", "child"]
    assert tree.guaranteed.shape == (2, len(r.FAIR_DIMS)) and tree.limit.shape == (2, len(r.FAIR_DIMS))
    assert tree.guaranteed[c].tolist() == g.tolist()
    assert tree.limit[c].tolist() == lim.tolist()
    assert tree.guaranteed[tree.index["root"]].tolist() == [0.0] * 4  # default: nothing guaranteed
    assert np.isinf(tree.limit[tree.index["root"]]).all()  # default: unlimited
    assert tree.weight[c] == 3.0


def test_queue_tree_rejects_unknown_parent() -> None:
    with pytest.raises(ValueError, match="parent 'nope' is not a queue"):
        QueueTree([QueueSpec("a", parent="nope")])


def test_queue_tree_rejects_cycles() -> None:
    with pytest.raises(ValueError, match="cycle"):
        QueueTree([QueueSpec("a", parent="b"), QueueSpec("b", parent="a"), QueueSpec("c")])
    with pytest.raises(ValueError, match="cycle"):
        QueueTree([QueueSpec("self", parent="self")])


def test_queue_tree_rejects_duplicates_and_bad_weights() -> None:
    with pytest.raises(ValueError, match="unique"):
        QueueTree([QueueSpec("a"), QueueSpec("a")])
    with pytest.raises(ValueError, match="weight"):
        QueueTree([QueueSpec("a", weight=0)])
    with pytest.raises(ValueError, match="weight"):
        QueueTree([QueueSpec("a", weight=-1)])


@st.composite
def shuffled_forests(draw: st.DrawFn) -> list[QueueSpec]:
    n = draw(st.integers(1, 12))
    parents = [None if i == 0 else draw(st.one_of(st.none(), st.integers(0, i - 1))) for i in range(n)]
    specs = [QueueSpec(f"q{i}", parent=None if p is None else f"q{p}") for i, p in enumerate(parents)]
    return draw(st.permutations(specs))


@FAST
@given(shuffled_forests())
def test_queue_tree_order_property(specs: list[QueueSpec]) -> None:
    tree = QueueTree(specs)
    names = tree.names()
    assert sorted(names) == sorted(s.name for s in specs)
    by_name = {s.name: s for s in specs}
    for i, name in enumerate(names):
        parent = by_name[name].parent
        if parent is None:
            assert tree.parent[i] == -1 and i in tree.roots
        else:
            assert names[tree.parent[i]] == parent and tree.parent[i] < i
            assert i in tree.children[tree.parent[i]]
    assert set(tree.leaves) == {i for i in range(len(tree)) if not tree.children[i]}
    assert sum(len(c) for c in tree.children) + len(tree.roots) == len(tree)
