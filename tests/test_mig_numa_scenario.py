"""Scenarios describe MIG and NUMA nodes (issue 12): the built-in `mig-numa` scenario's nodes are what the live
driver reads from HAMi's annotations for the same cards, so the simulator schedules them as live does; its
pods get MIG instances, one NUMA node and the NVLinked pair; the whole scenario simulates; and a recorded
trace keeps all of it for replay."""

from __future__ import annotations

import json

import numpy as np

from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.k8s import hami
from fairgpu.k8s.translate import node_spec
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec
from fairgpu.sim.runner import Simulation
from fairgpu.sim.scenario import load
from fairgpu.state import ClusterState
from fairgpu.twin.encode import node_doc, pod_doc
from fairgpu.twin.schema import NodeDoc, PodDoc

SAME = ("gpu_valid", "gpu_usable", "gpu_split", "gpu_mem_cap", "gpu_cores_cap", "gpu_numa", "gpu_mig", "mig_mem",
        "mig_cores", "mig_mask", "gpu_pair")  # fmt: skip


def _as_hami_node(n: NodeSpec) -> dict:
    """The Node HAMi's device plugin would register for these cards: register and pair score annotations."""
    split = ClusterState([n]).gpu_split[0]
    cards = [
        hami.RegisteredGpu(
            g.uuid, int(split[j]), g.memory_mib, g.cores, g.model, g.numa, g.healthy, j, g.mode,
            tuple(hami.MigProfile(p.name, p.memory_mib, p.cores, p.slices, p.placements) for p in g.mig),
        )
        for j, g in enumerate(n.gpus)
    ]  # fmt: skip
    scores = [{"uuid": a.uuid, "score": {b.uuid: n.pair_scores[i][j] for j, b in enumerate(n.gpus) if j != i}}
              for i, a in enumerate(n.gpus)] if n.pair_scores else []  # fmt: skip
    annotations = {hami.NODE_REGISTER: hami.encode_register(cards)}
    if scores:
        annotations[hami.NODE_SCORE] = json.dumps(scores)
    allocatable = {"cpu": f"{n.cpu_m}m", "memory": f"{n.memory_mib}Mi", "nvidia.com/gpu": str(int(split.sum()))}
    return {"metadata": {"name": n.name, "annotations": annotations}, "status": {"allocatable": allocatable}}


def test_scenario_nodes_are_what_the_live_driver_reads_from_hamis_annotations() -> None:
    sc = load("mig-numa")
    sim = ClusterState(sc.nodes)
    live = ClusterState([node_spec(_as_hami_node(n)) for n in sc.nodes])
    assert sim.has_mig and sim.has_pairs and set(sim.gpu_numa.ravel()) == {0, 1}
    for name in SAME:
        assert np.array_equal(getattr(sim, name), getattr(live, name)), name


def test_mig_numa_scenario_pods_get_mig_instances_one_numa_node_and_nvlinked_cards() -> None:
    """One workload of each group: the 5000 MiB pod a 1g.5gb instance (booked 5120 MiB, 14 cores), the 10000 MiB
    pod a 2g.10gb, both on MIG cards (vgpu-mode mig); the 2-GPU training pod an NVLinked pair on one NUMA node
    of an H100 node; the batch pod a whole H100 card."""
    sc = load("mig-numa")
    sched = Scheduler(sc.nodes, sc.tree(), load_profile("fairgpu"))
    firsts = {}
    for wl in sc.workloads:
        firsts.setdefault(wl.name.rsplit("-", 1)[0], wl)
    for wl in firsts.values():
        sched.submit(wl)
    bound = {b.workload.rsplit("-", 1)[0]: b.placement for b in sched.cycle(600.0).bound}
    st = sched.state
    names = st.node_names
    for group, booked in (("small", (5120, 14)), ("medium", (10240, 28))):
        p = bound[group]
        assert names[p.node].startswith("mig-") and p.mig and (p.mem_mib[0], p.cores[0]) == booked
    train = bound["train"]
    assert names[train.node].startswith("h100-") and len(train.slots) == 2
    assert len({int(st.gpu_numa[train.node, s]) for s in train.slots}) == 1
    a, b = train.slots
    assert st.gpu_pair[train.node, a, b] == 300
    assert names[bound["batch"].node].startswith("h100-") and bound["batch"].cores == (100,)
    st.check_invariants()


def test_mig_numa_scenario_simulates_to_the_end() -> None:
    """Every group runs work over the horizon, MIG slices and cards never double-booked (the state's invariants,
    MIG slices included, hold at the end)."""
    sc = load("mig-numa")
    sim = Simulation(sc, load_profile("fairgpu"))
    res = sim.run()
    started = {name.rsplit("-", 1)[0] for name in res.starts}
    assert started == {"small", "medium", "train", "batch"}
    sim.sched.state.check_invariants()


def test_a_recorded_trace_keeps_mig_numa_and_pair_scores() -> None:
    """The twin's trace (twin/schema.py) carries what this engine schedules by: a card's MIG profiles, NUMA node
    and devcore, the node's pair scores, a pod's further GPU containers, numa-bind and scoring weights; a replay
    would otherwise schedule MIG cards as ordinary ones."""
    sc = load("mig-numa")
    for n in sc.nodes:
        assert NodeDoc.model_validate(node_doc(n)).spec() == n
    pod = PodSpec(gpu=GpuRequest(2, 30, 1000), more_gpus=(GpuRequest(1, 10, 0, 50),), numa_bind=True,
                  gpu_policy="binpack,topology-aware", gpu_weights=(1, 0, 3))  # fmt: skip
    assert PodDoc.model_validate(pod_doc(pod)).spec() == pod
    assert "cores" not in node_doc(NodeSpec("x", 1, 1, (GpuDevice("m", 1),)))["gpus"][0]  # defaults stay unwritten
