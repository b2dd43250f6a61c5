"""Preemption on MIG cards (issue 12): evicting a MIG pod in a dry run gives its MIG instance back, so room on
a full MIG card can be planned, and the plan is the placement binding then makes."""

from __future__ import annotations

import numpy as np

from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload
from fairgpu.model.mig import MigTemplate
from fairgpu.model.placement import MIG_WHOLE, Footprint
from fairgpu.state import ClusterState

A100 = (  # HAMi's a100MigProfiles (pkg/device/nvidia/mig_capability_test.go)
    MigTemplate("1g.5gb", 5120, 14, 1, tuple((i, 1) for i in range(7))),
    MigTemplate("2g.10gb", 10240, 28, 2, ((0, 2), (2, 2), (4, 2))),
    MigTemplate("3g.20gb", 20480, 42, 3, ((0, 4), (4, 4))),
)


def _mig_node(name: str = "mig") -> NodeSpec:
    return NodeSpec(
        name, 64000, 256000, (GpuDevice("NVIDIA A100", 40960, f"GPU-{name}", split=7, mode="mig", mig=A100),)
    )


def _pod(mem: int) -> PodSpec:
    return PodSpec(cpu_m=100, memory_mib=100, gpu=GpuRequest(1, 0, mem))


def test_a_mig_node_preemption_is_planned_and_bound_where_the_victim_was() -> None:
    """Two borrowed 3g.20gb instances fill the card. A guaranteed queue's 3g.20gb pod evicts exactly one of them
    (equal sizes: no-ping-pong holds), and once it is gone binds on the slices the victim held. Before, the dry
    run freed the victim's memory and cores but not its slices: no room was ever found and nothing was
    evicted."""
    guaranteed = QueueSpec(
        "a", guaranteed=r.quota_vector({"nvidia.com/gpu": 1, "nvidia.com/gpumem": "20Gi"}, default=np.inf)
    )
    sched = Scheduler([_mig_node()], QueueTree([guaranteed, QueueSpec("b")]), load_profile("fairgpu"))
    for i in range(2):
        sched.submit(Workload(f"b{i}", "b", (_pod(20480),), duration=3600.0))
    bound = sched.cycle(0.0).bound
    assert sorted(b.placement.mig for b in bound) == [(10,), (11,)] and sched.state.mig_busy[0, 0] == 0xFF
    held = {b.workload: b.placement for b in bound}
    sched.submit(Workload("a0", "a", (_pod(20480),), duration=3600.0))
    evicted = sched.cycle(10.0).evictions
    assert len(evicted) == 1
    victim = held[evicted[0].workload]
    sched.remove(evicted[0].workload)
    res = sched.cycle(11.0)
    assert res.started == ["a0"]
    p = res.bound[0].placement
    assert (p.mem_mib, p.cores, p.mig) == ((20480,), (42,), victim.mig)  # the victim's 3g.20gb instance
    sched.state.check_invariants()


def test_without_frees_exactly_the_footprints_instances() -> None:
    """The dry-run copy clears only the freed instances' slices (the others stay held); a card held whole by an
    unreadable reservation (MIG_WHOLE) keeps every slice until that entry itself is freed, then shows what the
    rest of its ledger holds."""
    st = ClusterState([_mig_node()])
    small = st.placement_for(_pod(5000), 0, (0,))
    st.assign("s", small)
    big = st.placement_for(_pod(20000), 0, (0,))
    st.assign("g", big)
    both = st.mig_busy[0, 0]
    fp = _footprint(st, ["g"])
    after = st.without(fp)
    assert after.mig_busy[0, 0] == st.mig_slices(0, 0, small.mig[0]) and st.mig_busy[0, 0] == both
    assert after.gpu_mem_free[0, 0] == st.gpu_mem_free[0, 0] + 20480
    whole = st.placement_for(_pod(0), 0, (0,))  # a reservation nobody could read: every slice
    object.__setattr__(whole, "mig", (MIG_WHOLE,))
    object.__setattr__(whole, "cores", (0,))
    object.__setattr__(whole, "mem_mib", (0,))
    st._apply(whole, -1)
    st._ledger["w"] = whole
    assert st.without(_footprint(st, ["g"])).mig_busy[0, 0] == -1  # still held whole
    assert st.without(_footprint(st, ["w"])).mig_busy[0, 0] == both  # the real instances remain
    assert st.without(_footprint(st, ["w", "s", "g"])).mig_busy[0, 0] == 0


def _footprint(st: ClusterState, keys: list[str]) -> Footprint:
    pods, slots = [], []
    for t, k in enumerate(keys):
        p = st.placement(k)
        assert p is not None
        pods.append((p.node, p.cpu_m, p.memory_mib, t))
        slots += [(p.node, s, c, m, p.mig[e] if p.mig else -1, t)
                  for e, (s, c, m) in enumerate(zip(p.slots, p.cores, p.mem_mib, strict=True))]  # fmt: skip
    return Footprint.from_rows(pods, slots)
