"""Speed must not change a decision: the compiled Fragmentation kernels against its NumPy path and the
engine's per-shape cache of filter and score results against a fresh evaluation of every node, bit for
bit (and the plugin's incremental aggregates against ones built from scratch, up to float32 rounding),
over a run of placements and releases on a mixed cluster whose memory, CPU and GPU models all bind."""

from __future__ import annotations

import copy
import dataclasses
import gc
import hashlib
import json
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import gpu_node

from fairgpu.catalog import load_profile
from fairgpu.framework import evaluations as ev
from fairgpu.framework.interfaces import EngineView, FitMask, Profile
from fairgpu.framework.placement import feasible, place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload
from fairgpu.plugins.fit import Resources
from fairgpu.plugins.fragmentation import Fragmentation
from fairgpu.plugins.scores import Binpack, LeastAllocated, Spread


def cluster() -> list[NodeSpec]:
    """Three GPU models, 4 or 8 GPUs, CPU and memory from scarce to plenty: shapes fit on few nodes or many."""
    models = (("A100-80GB", 81920), ("A10-24GB", 24576), ("T4", 15360))
    return [
        gpu_node(f"n{i}", gpus=8 if i % 3 else 4, model=models[i % 3][0], mem_mib=models[i % 3][1],
                 cpu_m=(8 + 24 * (i % 4)) * 1000, memory_mib=(24 + 40 * (i % 5)) * 1024)
        for i in range(24)
    ]  # fmt: skip


def draw(rng: np.random.Generator) -> PodSpec:
    u = rng.random()
    if u < 0.1:  # CPU only, some asking most of a small node's memory
        return PodSpec(cpu_m=int(rng.integers(1, 8)) * 1000, memory_mib=int(rng.choice([1, 8, 20])) * 1024)
    if u < 0.55:
        count = int(rng.choice([1, 1, 2, 4, 8]))
        return PodSpec(cpu_m=2000 * count, memory_mib=4096 * count, gpu=GpuRequest(count, 100, 0, 100))
    cores = int(rng.choice([0, 10, 25, 30, 50, 75]))
    include = ("A100",) if rng.random() < 0.2 else ()
    return PodSpec(cpu_m=1000, memory_mib=512, gpu=GpuRequest(1, cores, int(rng.integers(1, 12)) * 1024),
                   gpu_include=include)  # fmt: skip


def churn(
    steps: int, seed: int, before=None, after=None, dry_runs: bool = False, profile: str | Profile = "fairgpu"
) -> None:
    """Place `steps` random pods where the fairgpu profile puts them, releasing a random one now and then;
    `before(view, profile, pod, key)` runs before each is placed, `after` once the profile chose (and learned
    from the pod) but before the choice is assigned. `dry_runs`: now and then a dry run in place frees a
    placed pod and places another, which its end undoes."""
    rng = np.random.default_rng(seed)
    sched = Scheduler(
        cluster(), QueueTree([QueueSpec("q")]), load_profile(profile) if isinstance(profile, str) else profile
    )
    view, profile, placed = sched.view, sched.profile, []
    for i in range(steps):
        pod = draw(rng)
        if before:
            before(view, profile, pod, f"p{i}")
        p = place_pod(pod, view, profile, key=f"p{i}")
        if after:
            after(view, profile, pod, f"p{i}")
        if p is not None:
            view.state.assign(f"p{i}", p)
            placed.append(f"p{i}")
        if placed and rng.random() < 0.25:
            view.state.release(placed.pop(int(rng.integers(len(placed)))))
        if dry_runs and placed and rng.random() < 0.2:
            with view.state.dry_run() as dry:
                dry.release(placed[int(rng.integers(len(placed)))])
                if (q := place_pod(draw(rng), view, profile)) is not None:
                    dry.assign("\0dry", q)
                if before:  # evaluated inside the dry run too: the caches follow it in and back out
                    before(view, profile, draw(rng), "\0dry")


def frag(profile: Profile) -> Fragmentation:
    return next(p for p, _ in profile.score if isinstance(p, Fragmentation))


def test_compiled_kernels_match_the_numpy_path_and_a_fresh_build_bit_for_bit():
    numpy_path: list[Fragmentation] = []
    checked, by_memory, starved, pressed = [0], [0], [0], [0]

    def start(view: EngineView, profile: Profile, pod: PodSpec, key: str) -> None:
        if not numpy_path:  # the same plugin, same args, on the NumPy path, before it learned anything
            assert frag(profile).memory and frag(profile).pressure  # the profile's measure is what is checked
            numpy_path.append(copy.deepcopy(frag(profile)))
            numpy_path[0].compiled = False

    def act(view: EngineView, profile: Profile, pod: PodSpec, key: str) -> None:
        compiled, plain = frag(profile), numpy_path[0]
        mask = feasible(pod, view, profile)
        if not mask.nodes.any():
            return
        plain.learn(key, pod)  # as place_pod just made the compiled one
        plain.generation(pod, view)
        fresh = copy.deepcopy(plain)  # the same learned mix, aggregates rebuilt from the state
        fresh._agg = None
        fresh._aggregates(view.state)
        a, b, c = (f.score(pod, view, mask) for f in (compiled, plain, fresh))
        assert np.array_equal(a, b)
        ka, pa, fa = compiled._agg, plain._agg, fresh._agg
        assert ka is not None and pa is not None and fa is not None
        for name in (
            "free",
            "cpu",
            "mem",
            "fit_count",
            "fit_free",
            "access",
            "hosts",
            "room",
            "free_total",
            "usable",
            "need",
            "price",
        ):
            assert np.array_equal(getattr(ka, name), getattr(pa, name)), name
        assert np.array_equal(compiled._w, plain._w)
        # room, hosts and the free total sum integers: any order of refreshes gives the fresh build's values;
        # need and price are each node's alone (float64 products round a row alike in any batch), whatever
        # rows new weights left as they were
        for name in ("room", "hosts", "free_total", "need", "price"):
            assert np.array_equal(getattr(ka, name), getattr(fa, name)), name
        # the run must exercise memory and pressure: a shape held off a node by its memory alone (the
        # memory-aware measure avoids that: a few), and weights boosted by pressure
        cpu_ok = (ka.fit_count >= compiled._mix.k) & (ka.cpu[:, None] >= compiled._mix.cpu) & ka.access
        by_memory[0] += int((cpu_ok & (ka.mem[:, None] < compiled._mix.mem)).any())
        # and memory feeding fewer of a shape's GPUs than have room for it where it fits (memory_short)
        fits = cpu_ok & (ka.mem[:, None] >= compiled._mix.mem)
        starved[0] += int((fits & (ka.fit_free > ka.mem[:, None] * compiled._mix.gpu_per_mib)).any())
        pressed[0] += int(not np.array_equal(compiled._w, compiled._mix.p))
        # kept current node by node, the aggregates sum in float32 over other row groupings than a fresh
        # build does (as they always have): equal up to that rounding, far from any stale value
        assert np.allclose(a, c, rtol=0, atol=1e-3)
        node = int(np.argmax(np.where(mask.nodes, a, -np.inf)))
        if pod.gpu is not None and mask.slots is not None:
            slots = np.flatnonzero(mask.slots[node])
            orders = [f.gpu_order(pod, view, node, slots) for f in (compiled, plain)]
            assert np.array_equal(orders[0], orders[1])
        checked[0] += 1

    churn(300, 7, before=start, after=act)
    assert checked[0] > 150  # most pods found a node: the comparison ran on a filling, draining cluster
    assert by_memory[0] > 5 and starved[0] > 20 and pressed[0] > 20, (by_memory, starved, pressed)


@pytest.mark.parametrize("name", ["fairgpu", "kube-default", "fairgpu, filters reversed"])
def test_cached_filter_and_score_results_equal_a_fresh_evaluation_of_every_node(name):
    """Every pod's kept verdicts and totals against every node evaluated afresh. Filters reversed, `Resources`
    comes before `GpuType`: for a pod that allows only some GPU models it is not the pod's only filter, and
    its compiled pass writing the changed rows straight into the shape (`filter_into`) would keep cards of
    other models."""
    checked = [0]
    profile = load_profile(name.split(",")[0])
    if name.endswith("reversed"):
        profile = dataclasses.replace(profile, filter=profile.filter[::-1])

    def act(view: EngineView, profile: Profile, pod: PodSpec, key: str) -> None:
        check(view, profile, pod)
        if pod.gpu is not None and not pod.gpu.exclusive:  # its twin asking other GPU memory, right after
            mem = pod.gpu.mem_mib % (12 * 1024) + 3 * 1024
            check(view, profile, dataclasses.replace(pod, gpu=dataclasses.replace(pod.gpu, mem_mib=mem)))

    def check(view: EngineView, profile: Profile, pod: PodSpec) -> None:
        shape = ev.filtered(pod, view, profile)
        fresh = ev.run_filters(pod, view, profile, slice(None))
        assert np.array_equal(shape.nodes, fresh.nodes)
        if fresh.slots is not None:
            assert shape.slots is not None and np.array_equal(shape.slots, fresh.slots)
        if not shape.nodes.any():
            return
        total = ev.scored(shape, pod, view, profile).copy()
        every = np.zeros(view.state.num_nodes)
        for plugin, weight in profile.score:  # generations already taken by `scored`: no relearning
            every += weight * plugin.score(pod, view, fresh)
        # -inf exactly where the filters refuse a node, so one argmax picks the best node that fits
        assert np.array_equal(total, np.where(fresh.nodes, every, -np.inf))
        checked[0] += 1

    churn(300, 11, before=act, dry_runs=True, profile=profile)
    assert checked[0] > 200


_WARM = """
import json
from fairgpu.catalog import load_profile
from fairgpu.plugins import node_kernels, fragmentation_kernels
from tests.test_evaluations import churn
kernels_ = [
    k for m in (fragmentation_kernels, node_kernels) for k in vars(m).values()
    if hasattr(k, "signatures") and hasattr(k, "py_func")
]
load_profile("fairgpu")
built = {k.py_func.__name__: len(k.signatures) for k in kernels_}
churn(150, 5)
after = {k.py_func.__name__: len(k.signatures) for k in kernels_}
from fairgpu.plugins.fragmentation import Fragmentation
from fairgpu.plugins.scores import Binpack
Fragmentation(by_demand=True, memory=True, cpu_balance=0.5)  # a weight the profile gave as a float
Binpack()
print(json.dumps([built, after, {k.py_func.__name__: len(k.signatures) for k in kernels_}]))
"""


def test_building_the_plugin_loads_every_kernel_the_placements_then_call():
    """The profile's plugin loads its kernels when built (numba's start-up and each cache load, ~0.4 s in
    all), for the very argument types placements pass: a type the warm-up missed would load, or compile,
    again during the first decisions. In a fresh process, so that no earlier test loaded them."""
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", _WARM], cwd=root, capture_output=True, text=True, check=True)
    built, after, settings = json.loads(out.stdout)
    # kernels called only from other kernels are compiled into them and never load on their own
    assert sum(1 for n in built.values() if n) >= 10 and built["cards"] and built["free_fraction"], built
    assert after == built  # whole, several and shared GPUs, CPU-only pods, releases: nothing new loaded
    # other settings of the plugins (a float `cpu_balance` where the profile has 1) call the same signatures:
    # a new one would compile (seconds, holding the interpreter lock) on a live scheduler's first decisions
    assert settings == built


def gang_cycles(seed: int) -> tuple[str, int, int]:
    """Cycles of gangs and single pods (whole, shared and several GPUs) on the mixed cluster, some finishing
    between cycles; after each cycle every submitted pod shape's cached results are compared with a fresh
    evaluation of every node. Returns the digest of every decision, the comparisons made and the gang
    members placed beside their first pod."""
    rng = np.random.default_rng(seed)
    sched = Scheduler(cluster(), QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    view, profile = sched.view, sched.profile
    digest = hashlib.sha256()
    pods: list[PodSpec] = []
    checked = members = 0
    for c in range(3):
        for i in range(16):
            size = int(rng.integers(2, 9)) if rng.random() < 0.5 else 1
            pods.append(draw(rng))
            sched.submit(Workload(f"w{c}-{i}", "q", (pods[-1],) * size))
        for b in sched.cycle(float(c)).bound:
            digest.update(repr(b).encode())
            members += b.pod > 0
        for pod in pods:
            shape = ev.filtered(pod, view, profile)
            fresh = ev.run_filters(pod, view, profile, slice(None))
            if shape.nodes.any():
                total = ev.scored(shape, pod, view, profile).copy()
                every = sum(w * p.score(pod, view, fresh) for p, w in profile.score)
                assert np.array_equal(total, np.where(fresh.nodes, every, -np.inf))
                checked += 1
        for name in sorted(sched.running)[: len(sched.running) // 3]:
            sched.remove(name)
    return digest.hexdigest()[:16], checked, members


def test_a_gang_member_with_one_node_left_places_as_before_and_the_caches_catch_up():
    """A gang's next member with a single node of its gang left that can take it goes there without the
    scores being brought up to date; the next pod that needs them catches up on every node changed since.
    Every decision is the one the engine makes when it scores every member (the digest, recorded with the
    shortcut off, since memory_short's measure), and the cached results equal a fresh evaluation of every
    node after each cycle."""
    digest, checked, members = gang_cycles(3)
    assert checked > 30 and members > 40  # gangs filled nodes and spilled over to others
    assert digest == "e0c0305b8f993fb2"


@pytest.mark.parametrize("mixed", [True, False], ids=["200-core cards", "100-core cards"])
def test_the_compiled_card_checks_give_the_numpy_paths_verdicts(mixed: bool):
    """`Resources`' compiled path for GPU pods against its NumPy path, on changed rows (in one compiled pass)
    and on every node (NumPy's passes, from the open cards it keeps), over a filling and draining cluster with
    dry runs in place: where every fourth node has cards of 200 cores (a cores-100 task is a share there, alone
    only on 100-core cards) and at most 3 tasks a card, and where every card has 100 cores (a cores-100 pod
    takes idle cards, some asking gpumem the smaller cards lack): the same nodes, cards and counts. Without the
    cores-100 rule, the task limit, the 0-core rule, the idle cards' memory or their CPU check a verdict
    differs; so does a card kept open past a change (a placement, a release, a dry run or its undo)."""
    nodes = cluster()
    for i in range(0, len(nodes) if mixed else 0, 4):
        nodes[i].gpus = tuple(dataclasses.replace(d, cores=200, split=3) for d in nodes[i].gpus)
    sched = Scheduler(nodes, QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    view, profile = sched.view, sched.profile
    plain = copy.deepcopy(profile)
    resources = next(f for f in plain.filter if isinstance(f, Resources))
    resources.compiled = False
    rng = np.random.default_rng(5)
    placed: list[str] = []
    compared = shared = whole = 0
    for i in range(300):
        pod = draw(rng)
        if rng.random() < 0.3 and pod.gpu is not None:  # a cores-100 share or a 0-core task
            pod = dataclasses.replace(pod, gpu=dataclasses.replace(pod.gpu, cores=int(rng.choice([0, 100]))))
        if rng.random() < 0.3 and pod.gpu is not None and pod.gpu.exclusive:  # whole cards of at least 20 GiB
            pod = dataclasses.replace(pod, gpu=dataclasses.replace(pod.gpu, mem_mib=20 * 1024))
        rows = np.sort(rng.choice(view.state.num_nodes, size=5, replace=False))

        def compare(pod: PodSpec, rows: np.ndarray | slice) -> None:
            a, b = ev.run_filters(pod, view, profile, rows), ev.run_filters(pod, view, plain, rows)
            assert np.array_equal(a.nodes, b.nodes)
            if b.slots is not None:
                assert a.slots is not None and np.array_equal(a.slots, b.slots)
                assert np.array_equal(a.counts(), b.counts())

        compare(pod, rows)
        compare(pod, slice(None))
        if placed and rng.random() < 0.2:
            with view.state.dry_run() as dry:
                dry.release(placed[int(rng.integers(len(placed)))])
                compare(pod, slice(None))
        a = ev.run_filters(pod, view, profile, rows)
        compared += 1
        if pod.gpu is not None and a.nodes.any():
            whole += view.state.takes_whole_cards(pod.gpu)
            shared += not view.state.takes_whole_cards(pod.gpu)
        if (p := place_pod(pod, view, profile, key=f"p{i}")) is not None:
            view.state.assign(f"p{i}", p)
            placed.append(f"p{i}")
        if placed and rng.random() < 0.25:
            view.state.release(placed.pop(int(rng.integers(len(placed)))))
    assert compared == 300 and (shared > 100 and not whole if mixed else whole > 50), (shared, whole)


@pytest.mark.parametrize(
    "plugin", [Binpack(), Spread(), LeastAllocated(), LeastAllocated(resources=("memory", "gpu", "cpu"))], ids=repr
)
def test_the_compiled_free_fraction_scores_equal_the_numpy_path_bit_for_bit(plugin):
    """Binpack, Spread and LeastAllocated (resources in a given order, summed in it) on their compiled path and
    their NumPy path, on changed rows and on every node, over a filling and draining cluster (CPU-only, whole
    and shared GPU pods) with dry runs in place: the same floats. A kernel summing in another order, or dividing
    other counts, differs; so do every-node scores kept past a change (placement, release or a dry run's undo)
    without recomputing the nodes it changed."""
    plain = dataclasses.replace(plugin, compiled=False)
    compared = [0]

    def act(view: EngineView, profile: Profile, pod: PodSpec, key: str) -> None:
        mask = feasible(pod, view, profile)
        rows = np.flatnonzero(mask.nodes)[::2]
        for m in (mask, FitMask(mask.nodes[rows], None, rows=rows)):
            scores = plain.score(pod, view, m)
            assert np.array_equal(plugin.score(pod, view, m), scores)
            # the weighted sum's step: the engine's product and sum of these scores, bit for bit
            total = np.random.default_rng(compared[0]).normal(50.0, 30.0, len(m.nodes))
            for weight in (1.0, 0.001, 3.7):
                added = np.add(total, weight * scores, dtype=np.float64)
                for p in (plugin, plain):
                    assert np.array_equal(p.add_weighted(pod, view, m, weight, total), added, equal_nan=True)
            compared[0] += 1

    churn(200, 13, before=act, dry_runs=True)
    assert compared[0] > 400  # every pod, and pods inside dry runs


@pytest.mark.parametrize("plugin", [Spread(), Binpack(), LeastAllocated()], ids=repr)
def test_a_resource_a_node_has_one_unit_of_counts_in_the_compiled_free_fraction_as_on_the_numpy_path(plugin):
    """A node reporting 1 millicore of CPU (a virtual node) still has CPU: the compiled free-fraction scores
    leave out only a resource a node has none of, as the NumPy path does, on changed rows and on every node."""
    nodes = [NodeSpec("tiny", 1, 1024), NodeSpec("big", 64_000, 1 << 18)]
    view = Scheduler(nodes, QueueTree([QueueSpec("q")]), load_profile("kube-default")).view
    pod = PodSpec(cpu_m=0, memory_mib=512)
    plain = dataclasses.replace(plugin, compiled=False)
    for mask in (FitMask(np.ones(2, dtype=bool), None), FitMask(np.ones(2, dtype=bool), None, rows=np.arange(2))):
        assert np.array_equal(plugin.score(pod, view, mask), plain.score(pod, view, mask))


def test_a_fragmentation_plugin_asked_for_the_numpy_path_stays_on_it() -> None:
    """compiled=False is the NumPy path whatever BLAS the kernels could load (the tests that compare the two
    paths build their NumPy twin this way; were it compiled after all, they would compare a path with itself)."""
    assert Fragmentation(compiled=False).compiled is False
    assert dataclasses.replace(Fragmentation(), compiled=False).compiled is False


def test_where_numpy_carries_its_own_openblas_the_kernels_find_it() -> None:
    """NumPy's wheels bundle scipy-openblas: there the compiled path must find its routines (were they not
    found, every Fragmentation plugin would quietly fall back to its NumPy path: the same floats, slower)."""
    from fairgpu.plugins import blas

    if np.show_config(mode="dicts")["Build Dependencies"]["blas"].get("name") != "scipy-openblas":
        pytest.skip("NumPy without its bundled OpenBLAS")
    assert blas.AVAILABLE and Fragmentation().compiled


@pytest.mark.parametrize("cpu_balance", [1.0, 0.0])
def test_the_upkeep_writes_usable_capacities_only_into_a_cache_the_plugin_has(monkeypatch, cpu_balance) -> None:
    """kernels.upkeep brings the changed rows' usable capacity up to date in the plugin's cache, and writes
    nothing while the plugin has none (an empty array), as after a refresh of the mix; with one shape a refresh
    keeps its weights, so the kernel is not told by new weights. Nor need and price without cpu_balance (the
    plugin passes empty arrays). Compiled, a write past an array is silent memory corruption; run here as plain
    Python (the kernels it calls stay compiled), it raises."""
    from fairgpu.plugins import fragmentation_kernels as kernels

    uncached = [0]
    upkeep = kernels.upkeep.py_func

    def counted(*args):
        w, changed = upkeep(*args)
        uncached[0] += not changed and args[-1].size == 0
        return w, changed

    monkeypatch.setattr(kernels, "upkeep", counted)
    sched = Scheduler(cluster(), QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    next(p for p, _ in sched.profile.score if isinstance(p, Fragmentation)).cpu_balance = cpu_balance
    pod = PodSpec(cpu_m=1000, memory_mib=1024, gpu=GpuRequest(1, 30, 2048))
    for i in range(12):  # the mix refreshes at the 1st, 2nd, 3rd, 4th, 6th, 8th and 11th arrival
        p = place_pod(pod, sched.view, sched.profile, key=f"p{i}")
        assert p is not None
        sched.view.state.assign(f"p{i}", p)
    assert uncached[0] >= 3


def test_a_shape_asking_no_memory_adds_nothing_to_what_memory_cannot_feed_compiled_or_not() -> None:
    """The mix: a 1-GPU shape asking 64 GiB and one asking no memory at all. On a (2 GPUs, 128 GiB) a GPU pod
    taking 32 GiB leaves memory for 1.5 of the hungry shape's GPUs, so the memory term is computed there; the
    shape asking no memory is fed by any memory and counts 0 in it. The compiled path scores as the NumPy one,
    bit for bit, on both nodes."""
    gib = 1024
    nodes = [gpu_node("a", gpus=2, memory_mib=128 * gib), gpu_node("b", gpus=2, memory_mib=256 * gib)]
    sched = Scheduler(nodes, QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    view, profile = sched.view, sched.profile
    compiled = next(p for p, _ in profile.score if isinstance(p, Fragmentation))
    plain = copy.deepcopy(compiled)
    plain.compiled = False
    hungry = PodSpec(cpu_m=1000, memory_mib=64 * gib, gpu=GpuRequest(1, 100, 0, 100))
    for i, shape in enumerate((hungry, dataclasses.replace(hungry, memory_mib=0))):  # seen, not placed
        place_pod(shape, view, profile, key=f"s{i}")
        plain.learn(f"s{i}", shape)
    pod = dataclasses.replace(hungry, memory_mib=32 * gib)
    mask = feasible(pod, view, profile)
    plain.generation(pod, view)
    a, b = compiled.score(pod, view, mask), plain.score(pod, view, mask)
    assert np.array_equal(a, b), (a, b)


def test_the_score_sum_never_writes_into_an_array_a_plugin_keeps():
    """LeastAllocated and Binpack answer for every node with their cache's own array (scores._score). With
    weight 1, the first one's array is the running total unless the sum copies, and the second's scores added
    in place would land in the first's cache: its later answers for the pod's key, where no row changed,
    would carry the other plugin's scores. After each evaluation, over a filling and draining cluster, each
    plugin's answer for every node is its fresh computation row by row."""
    profile = dataclasses.replace(load_profile("kube-default"), score=[(LeastAllocated(), 1.0), (Binpack(), 1.0)])
    sched = Scheduler(cluster(), QueueTree([QueueSpec("q")]), profile)
    view, profile, placed = sched.view, sched.profile, []
    n = view.state.num_nodes
    rng = np.random.default_rng(5)
    checked = 0
    for i in range(60):
        pod = draw(rng)
        shape = ev.filtered(pod, view, profile)
        if shape.nodes.any():
            ev.scored(shape, pod, view, profile)
            for plugin, _ in profile.score:
                kept = plugin.score(pod, view, FitMask(np.ones(n, dtype=bool)))
                fresh = plugin.score(pod, view, FitMask(np.ones(n, dtype=bool), rows=np.arange(n)))
                assert np.array_equal(kept, fresh), (i, plugin.NAME)
            checked += 1
        if (p := place_pod(pod, view, profile, key=f"p{i}")) is not None:
            view.state.assign(f"p{i}", p)
            placed.append(f"p{i}")
        if placed and rng.random() < 0.3:
            view.state.release(placed.pop(int(rng.integers(len(placed)))))
    assert checked > 40, checked


def test_a_copy_of_the_state_evaluated_once_is_not_kept_alive_by_the_cache():
    """The engine keeps a state's pod shapes in a cache weakly keyed by the state, each shape with what it needs
    to bring itself up to date (its filters, its only filter's `filter_into`): anything there holding the state
    would keep every dry run's copy alive with its arrays for as long as the profile lives. So would a filter's
    own cache keyed by the state: half the pods ask for a GPU model, which `GpuType` masks per node list."""
    sched = Scheduler(cluster(), QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    view, profile = sched.view, sched.profile
    rng = np.random.default_rng(3)
    pods = [dataclasses.replace(draw(rng), gpu_include=()) for _ in range(6)]
    pods += [dataclasses.replace(draw(rng), gpu_include=("A100",)) for _ in range(6)]
    copy_ = view.state.copy()
    dry = dataclasses.replace(view, state=copy_)
    for pod in pods:
        shape = ev.filtered(pod, dry, profile)
        if shape.nodes.any():
            ev.scored(shape, pod, dry, profile)
    assert any(ev.filtered(p, dry, profile).into is not None for p in pods)  # writers were made
    gone = weakref.ref(copy_)
    del copy_, dry, shape
    gc.collect()
    assert gone() is None
