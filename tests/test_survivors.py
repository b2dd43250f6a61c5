"""Tests added for mutants that bench/mutate.py found surviving (docs/testing.md counts them; the per-mutant
record is `git show a748550:docs/testing.md`): each pins a behaviour that no other test checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import fraction, gpu_node, job, starving_gang_beside_a_stream, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.placement import filter_breakdown, place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload
from fairgpu.model.queue import PreemptionPolicy


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
        p = place_pod(pod, view, profile, avoid, key=f"fill{node}-{i}")
        assert p is not None and p.node == node
        view.state.assign(f"fill{node}-{i}", p)


def test_fgd_puts_a_cpu_only_pod_where_it_strands_no_gpu():
    """y has one GPU left and 12 cores, just enough for the mix's 1-GPU, 10-core pods; x is idle with 128
    cores. A CPU-only pod on y would leave y's last GPU without the CPU to use it, on x it strands nothing:
    FGD puts it on x, though y comes first and an 8-GPU pod is in the mix too (x alone can take one)."""
    profile = _fragmentation()
    view = Scheduler([gpu_node("y", cpu_m=82_000), gpu_node("x")], QueueTree([QueueSpec("q")]), profile).view
    _fill(view, profile, [whole(1, cpu_m=10_000)] * 7, node=0)
    assert place_pod(whole(8), view, profile, key="big").node == 1  # an 8-GPU pod seen (waiting), so in the mix
    assert place_pod(PodSpec(cpu_m=4000), view, profile, key="cpu").node == 1


def test_cpu_balance_sends_a_cpu_light_gpu_pod_where_cpu_is_short():
    """The mix so far: 1-GPU pods with 16 cores each. p has 8 idle GPUs but 32 cores, too few to feed them;
    q and r have CPU to spare. With the cpu_balance term, a 1-GPU pod needing 1 core goes to p (where it
    uses a GPU that would idle anyway for want of CPU) and q's CPU stays for CPU-hungry pods; q comes first
    in node order, and FGD's own measure sees no difference between them."""
    profile = _fragmentation(cpu_balance=1.0)
    nodes = [gpu_node("q"), gpu_node("p", cpu_m=32_000), gpu_node("r")]
    view = Scheduler(nodes, QueueTree([QueueSpec("q")]), profile).view
    _fill(view, profile, [whole(1, cpu_m=16_000)] * 4, node=2)
    assert place_pod(whole(1, cpu_m=1000), view, profile, key="light").node == 1


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


# -- plugins/preemption.py -----------------------------------------------------------------------------------------


def test_victims_go_by_queue_then_lowest_priority_then_least_work_lost():
    """a reclaims 1 of its 4 guaranteed GPUs. c is furthest above its share (5 held, 4 entitled): its work
    goes before b's (at its share), though b's is the lowest priority; within c, priority 5 before 6, though
    the priority-6 job started half a second ago and the priority-5 ones 100 s ago."""
    from test_preemption_rules import engine, evicted, gpus, run

    sched = engine([QueueSpec("a", guaranteed=gpus(4)), QueueSpec("b"), QueueSpec("c")])
    low = run(sched, "c", 4, 0.0, prefix="c5-", priority=5)
    sched.cycle(0.0)
    run(sched, "b", 3, 99.0, prefix="b0-", priority=0)
    sched.cycle(99.0)
    run(sched, "c", 1, 99.5, prefix="c6-", priority=6)
    sched.cycle(99.5)
    run(sched, "a", 1, 100.0)
    gone = evicted(sched.cycle(100.0))
    assert len(gone) == 1 and gone[0] in low


def test_a_job_never_evicts_its_own_queues_work_of_the_same_priority():
    """Queue a evicts its own lower-priority work (within_queue: LowerPriority). Its node is full of its
    priority-0 jobs: another priority-0 job waits; a priority-1 job evicts exactly one."""
    from test_preemption_rules import engine, evicted, run

    sched = engine([QueueSpec("a", preemption=PreemptionPolicy(within_queue="LowerPriority"))])
    run(sched, "a", 8, 0.0)
    sched.cycle(0.0)
    run(sched, "a", 1, 10.0, prefix="same")
    assert evicted(sched.cycle(10.0)) == []
    run(sched, "a", 1, 20.0, prefix="higher", priority=1)
    result = sched.cycle(20.0)
    assert len(result.evictions) == 1 and result.evictions[0].reason == "preempted for higher0"


def test_a_cpu_only_workload_reclaims_cpu_lent_from_its_guarantee():
    """a is guaranteed 64 of the node's 128 cores; b borrowed them all with four 32-core CPU-only pods.
    a's 32-core pod takes one back."""
    from test_preemption_rules import engine

    cpu = r.quota_vector({"cpu": "64"}, default=np.inf)
    sched = engine([QueueSpec("a", guaranteed=cpu), QueueSpec("b")])
    pod = PodSpec(cpu_m=32_000, memory_mib=1024)
    for i in range(4):
        sched.submit(Workload(f"b{i}", "b", (pod,), submit_time=0.0, duration=36000.0))
    sched.cycle(0.0)
    sched.submit(Workload("a0", "a", (pod,), submit_time=10.0, duration=36000.0))
    result = sched.cycle(10.0)
    assert len(result.evictions) == 1 and result.evictions[0].reason == "preempted for a0"


def test_a_victim_exactly_as_old_as_min_runtime_may_be_evicted():
    """min_runtime protects work *younger* than it: at exactly 300 s b's jobs are fair game."""
    from test_preemption_rules import engine, evicted, gpus, run

    sched = engine([QueueSpec("a", guaranteed=gpus(4)), QueueSpec("b", preemption=PreemptionPolicy(min_runtime=300))])
    run(sched, "b", 8, 0.0)
    sched.cycle(0.0)
    run(sched, "a", 1, 300.0)
    assert len(evicted(sched.cycle(300.0))) == 1


def test_of_two_victims_started_within_the_last_second_the_younger_goes():
    """Least work lost, to the fraction of a second: b0 started 0.8 s before a's reclaim, b1 0.1 s before."""
    from test_preemption_rules import engine, evicted, gpus, run

    sched = engine([QueueSpec("a", guaranteed=gpus(4)), QueueSpec("b")])
    run(sched, "b", 6, 0.0, prefix="old")
    sched.cycle(0.0)
    run(sched, "b", 1, 99.2, prefix="b0-")
    sched.cycle(99.2)
    run(sched, "b", 1, 99.9, prefix="b1-")
    sched.cycle(99.9)
    run(sched, "a", 1, 100.0)
    assert evicted(sched.cycle(100.0)) == ["b1-0"]


# -- k8s/leader.py -------------------------------------------------------------------------------------------------


def test_the_binding_fence_sees_exactly_the_term_left_and_none_for_a_standby(fake_api, tmp_path):
    """remaining() is what the binder's fence reads before every Binding: a new leader has its renew
    deadline left, counted down by its clock and never below 0 once the term is over though it has not yet
    stepped down; a standby has nothing. A sub-second lease is written as 1 s, the least the field takes."""
    import asyncio

    from fairgpu.k8s.client import KubeClient
    from fairgpu.k8s.leader import LeaderElector
    from fairgpu.k8s.port import LEASES
    from test_leader_rules import Clock

    async def go() -> None:
        clock = Clock()
        ports = [await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc"))) for _ in range(2)]
        a = LeaderElector(ports[0], "fairgpu-system", "fairgpu", "A", 10.0, 1.0, monotonic=clock)
        b = LeaderElector(ports[1], "fairgpu-system", "fairgpu", "B", 10.0, 1.0, monotonic=clock)
        tasks = [asyncio.create_task(a.run())]
        await asyncio.wait_for(a.leading.wait(), 10)
        tasks.append(asyncio.create_task(b.run()))
        assert a.remaining() == pytest.approx(10.0 * 2 / 3)
        clock.t = 4.0
        assert a.remaining() == pytest.approx(10.0 * 2 / 3 - 4.0)
        clock.t = 7.0  # the term is over; the step-down timer runs on the loop's own clock, not yet
        assert a.leading.is_set() and a.remaining() == 0.0
        assert not b.leading.is_set() and b.remaining() == 0.0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        short = LeaderElector(ports[1], "fairgpu-system", "short", "B", 0.3, 0.1, renew_deadline=0.2)
        assert await short.try_acquire_or_renew()
        lease = await ports[1].get(LEASES, "short", "fairgpu-system")
        assert lease["spec"]["leaseDurationSeconds"] == 1
        for p in ports:
            await p.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_cut_off_leader_steps_down_when_its_term_ends_not_at_its_next_attempt(fake_api, tmp_path):
    """Renew deadline 2.5 s, an attempt every 2 s: cut off right after winning, the leader's next attempts
    fail at about 2 s and 4 s. Its term ends at 2.5 s, and it stops leading then, by its timer; the attempt
    at 4 s would be 1.5 s too late (a standby may act from the lease duration, 3 s, on)."""
    import asyncio
    import time

    from fairgpu.k8s.client import KubeClient
    from fairgpu.k8s.leader import LeaderElector
    from test_leader_rules import Partitioned

    async def go() -> float:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        link = Partitioned(port)
        a = LeaderElector(link, "fairgpu-system", "fairgpu", "A", 3.0, 2.0, renew_deadline=2.5)  # type: ignore[arg-type]
        task = asyncio.create_task(a.run())
        await asyncio.wait_for(a.leading.wait(), 10)
        link.cut, won = True, time.monotonic()
        while a.leading.is_set() and time.monotonic() - won < 6:
            await asyncio.sleep(0.02)
        down = time.monotonic() - won
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await port.close()
        return down

    assert 2.0 < asyncio.run(asyncio.wait_for(go(), 30)) < 3.5


def test_a_renewal_on_a_slow_apiserver_is_given_up_at_the_term_end_not_answered_late(fake_api, tmp_path):
    """Renew deadline 1 s, an attempt every 0.5 s. The apiserver then takes 1.5 s to answer each request: the
    renewal begun at about 0.5 s is abandoned when the term ends, at 1 s, and the leader steps down once (and
    every later attempt, given 1 s, is abandoned too). Were it let run, its read and write would land at
    3.5 s and make the replica leader again, for a term already over: a second step-down."""
    import asyncio

    from fairgpu.k8s.client import KubeClient
    from fairgpu.k8s.leader import LeaderElector

    class Slow:
        def __init__(self, port: KubeClient) -> None:
            self.port, self.delay = port, 0.0

        def __getattr__(self, name: str):
            attr = getattr(self.port, name)

            async def call(*args, **kw):
                await asyncio.sleep(self.delay)
                return await attr(*args, **kw)

            return call if callable(attr) else attr

    async def go() -> int:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        link = Slow(port)
        a = LeaderElector(link, "fairgpu-system", "fairgpu", "A", 1.5, 0.5, renew_deadline=1.0)  # type: ignore[arg-type]
        lost: list[int] = []
        a.on_lost.append(lambda: lost.append(1))
        task = asyncio.create_task(a.run())
        await asyncio.wait_for(a.leading.wait(), 10)
        link.delay = 1.5
        await asyncio.sleep(4.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await port.close()
        return len(lost)

    assert asyncio.run(asyncio.wait_for(go(), 30)) == 1


def test_taking_over_a_foreign_lease_that_never_counted_transitions_counts_the_first(fake_api, tmp_path):
    """client-go omits leaseTransitions while it is 0. A lease another elector left without the field, once
    expired as this replica saw it, is taken over with leaseTransitions 1."""
    import asyncio

    from fairgpu.k8s.client import KubeClient
    from fairgpu.k8s.leader import LeaderElector
    from fairgpu.k8s.port import LEASES
    from test_leader_rules import Clock

    async def go() -> dict:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        spec = {"holderIdentity": "other", "leaseDurationSeconds": 10, "renewTime": "2026-01-01T00:00:00.000000Z"}
        await port.create(LEASES, {"metadata": {"name": "fairgpu"}, "spec": spec}, "fairgpu-system")
        clock = Clock()
        a = LeaderElector(port, "fairgpu-system", "fairgpu", "A", 10.0, 1.0, monotonic=clock)
        assert not await a.try_acquire_or_renew()
        clock.t = 10.0
        assert await a.try_acquire_or_renew()
        lease = await port.get(LEASES, "fairgpu", "fairgpu-system")
        await port.close()
        return lease["spec"]

    held = asyncio.run(asyncio.wait_for(go(), 30))
    assert (held["holderIdentity"], held["leaseTransitions"]) == ("A", 1)


# -- k8s/webhook.py ------------------------------------------------------------------------------------------------


def test_a_cpu_pod_naming_fairgpu_needs_the_users_stamp_and_a_cpu_pod_may_not_forge_one():
    """A CPU-only pod that names fairgpu is scheduled by it, so it must carry the stamp the mutating webhook
    writes: stamped as the mutating webhook does it, it is admitted; without the stamp, refused. A CPU pod for
    another scheduler may not carry a stamp label either (fairgpu reads any pod with its control keys)."""
    from fairgpu.k8s.identity import USER_LABEL, Trust
    from fairgpu.k8s.webhook import check_create, mutate
    from fakeapi.patches import json_patch

    def check(pod: dict) -> str | None:
        return check_create(pod, "a", "alice", Trust(), lambda q: (), "fairgpu")

    pod = {"metadata": {"name": "p"}, "spec": {"schedulerName": "fairgpu", "containers": [{"name": "c"}]}}
    stamped = json_patch(pod, mutate(pod, "alice", "fairgpu"))
    assert check(stamped) is None
    assert check(pod) == f"metadata.labels[{USER_LABEL}]: set by fairgpu only; alice may not write it"
    other = {"metadata": {"name": "q", "labels": {USER_LABEL: "bob"}}, "spec": {"containers": [{"name": "c"}]}}
    assert check(other) == f"metadata.labels[{USER_LABEL}]: set by fairgpu only; alice may not write it"


def test_the_mutating_webhook_answers_what_it_does_not_handle_without_patching_it():
    """Served as `fairgpu run` serves it (aiohttp, 127.0.0.1): a body that is no AdmissionReview is a 400
    naming why; a review without an object, and a pod UPDATE, are allowed unpatched; a GPU pod's CREATE is
    patched (the contrast)."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from fairgpu.k8s.webhook import webhook_app

    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "resources": {"limits": {r.GPU: "1"}}}]}}

    def review(operation: str, obj: dict | None) -> dict:
        request = {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": operation}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {**request, "object": obj}}

    async def go() -> list:
        async with TestClient(TestServer(webhook_app(lambda q: ()), host="127.0.0.1")) as client:
            bad = await client.post("/mutate", data=b"{}")
            out = [bad.status, (await bad.json())["error"].startswith("not an AdmissionReview")]
            for operation, obj in (("CREATE", None), ("UPDATE", pod), ("CREATE", pod)):
                response = (await (await client.post("/mutate", json=review(operation, obj))).json())["response"]
                out.append((response["allowed"], "patch" in response))
            return out

    assert asyncio.run(asyncio.wait_for(go(), 30)) == [400, True, (True, False), (True, False), (True, True)]


def test_the_mutating_webhook_writes_hamis_defaults_and_runtime_class_only_where_a_gpu_is_asked_for():
    """A GPU container and a CPU sidecar: the GPU container gets HAMi's default gpucores, the sidecar nothing;
    with HAMi's runtimeClassName configured the pod gets it. A pod that a controller named by
    `--pod-controller` makes from a template keeps the user the template carries (bob), not the controller's
    name."""
    from fairgpu.hamiconfig import HamiConfig
    from fairgpu.k8s.identity import FAIRGPU_SA, USER_ANNOTATION, Trust, user_label
    from fairgpu.k8s.webhook import mutate

    gpu = {"name": "c", "resources": {"limits": {r.GPU: "1"}}}
    pod = {
        "metadata": {"name": "p", "annotations": {USER_ANNOTATION: "bob"}},
        "spec": {"containers": [gpu, {"name": "s"}]},
    }
    operator = "system:serviceaccount:ml:training-operator"
    ops = mutate(pod, operator, "fairgpu", Trust.of(FAIRGPU_SA, controllers=[operator]))
    assert [op["path"] for op in ops if op["path"].startswith("/spec/containers")] == [
        "/spec/containers/0/resources/limits/nvidia.com~1gpucores"
    ]
    assert not any(op["path"].startswith("/metadata/annotations") for op in ops)  # bob's name stays
    assert {"op": "add", "path": "/metadata/labels/fairgpu.io~1user", "value": user_label("bob")} in ops
    alone = {"metadata": {"name": "p"}, "spec": {"containers": [gpu]}}
    config = HamiConfig.model_validate({"runtimeClassName": "nvidia"})
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"} in mutate(
        alone, "a", "fairgpu", config=config
    )


def test_a_gpumem_percentage_from_0_to_100_is_admitted_and_beyond_refused():
    from fairgpu.k8s.webhook import validate
    from fairgpu.model.pod import DEFAULT_RULES

    def pct(value: str) -> str | None:
        limits = {r.GPU: "1", DEFAULT_RULES.names[2]: value}
        return validate({"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}, "a", lambda q: ())

    assert pct("0") is None and pct("100") is None
    assert pct("101") == "nvidia.com/gpumem-percentage: 101 must be between 0 and 100 (container c)"


def test_fair_share_preemption_never_takes_from_a_queue_below_its_share():
    """8 GPUs, three equal queues, each entitled 8/3. c holds 6 but all of it is younger than c's min_runtime;
    b holds 2, below its share. a (fair share) wants 4: it may take only from c, which is protected, so
    nothing is evicted — b's work would do, without breaking no-ping-pong, but b is not above its share.
    Without the min_runtime, c's work goes."""
    from test_preemption_rules import engine, evicted, run

    for min_runtime in (1000.0, 0.0):
        fair = PreemptionPolicy(reclaim=False, fair_share=True)
        c = PreemptionPolicy(min_runtime=min_runtime)
        sched = engine([QueueSpec("a", preemption=fair), QueueSpec("b"), QueueSpec("c", preemption=c)])
        run(sched, "c", 6, 0.0)
        run(sched, "b", 2, 0.0)
        sched.cycle(0.0)
        run(sched, "b", 1, 5.0, prefix="b-more")
        run(sched, "a", 4, 10.0)
        gone = evicted(sched.cycle(10.0))
        assert all(v.startswith("c") for v in gone) and bool(gone) == (min_runtime == 0.0), (min_runtime, gone)


def test_fairgpu_runs_the_election_timing_docs_deploy_md_states(fake_api, tmp_path):
    """docs/deploy.md: lease duration 15 s > renew deadline 10 s > retry period 2 s, as `fairgpu run` builds
    its elector (the defaults); the Lease a cluster admin reads says 15 s."""
    import asyncio

    from fairgpu.k8s.client import KubeClient
    from fairgpu.k8s.leader import LeaderElector
    from fairgpu.k8s.port import LEASES

    async def go() -> tuple:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        e = LeaderElector(port, "fairgpu-system", "fairgpu", "A")
        assert await e.try_acquire_or_renew()
        lease = await port.get(LEASES, "fairgpu", "fairgpu-system")
        await port.close()
        return lease["spec"]["leaseDurationSeconds"], e.renew_deadline, e.retry_period

    assert asyncio.run(asyncio.wait_for(go(), 30)) == (15, 10.0, 2.0)
    assert "(lease duration 15 s > renew deadline 10 s > retry period 2 s)" in " ".join(
        (Path(__file__).parent.parent / "docs" / "deploy.md").read_text().split()
    )


# -- framework/placement.py: the fill's failure breakdown (unplaced_cause) at each boundary ----------------------


def _cause(nodes: list[NodeSpec], taken: list[tuple[int, int, PodSpec]], pod: PodSpec) -> str:
    """The cause `fairgpu fill` reports for `pod`, which must fit nowhere, after `taken` (node, GPU, pod)."""
    from fairgpu.framework.placement import unplaced_cause

    profile = load_profile("fairgpu")
    view = Scheduler(nodes, QueueTree([QueueSpec("q")]), profile).view
    for i, (node, slot, p) in enumerate(taken):
        view.state.assign(f"t{i}", view.state.placement_for(p, node, (slot,)))
    assert place_pod(pod, view, profile) is None
    return unplaced_cause(pod, view.state)


def test_a_cordoned_nodes_gpus_are_no_capacity_for_a_pod_that_fits_nowhere():
    """`up` has 199 % of a GPU free (GPU 0 taken, GPU 1 short of one core); the cordoned node's four idle GPUs
    do not count, nor do slots without a GPU (up has 3 of 4): a 2-GPU pod finds no capacity."""
    nodes = [gpu_node("up", gpus=3), gpu_node("cordoned", gpus=4, schedulable=False)]
    taken = [(0, 0, whole(1)), (0, 1, fraction(1, 1024))]
    assert _cause(nodes, taken, whole(2)) == "no GPU capacity left"


def test_capacity_exactly_equal_to_the_request_is_enough_and_the_gpus_are_too_scattered():
    """Two idle GPUs, one on each node: exactly the 200 % a 2-GPU pod asks for, but not on one node."""
    nodes = [gpu_node("a", gpus=2, model="T4"), gpu_node("b", gpus=2, model="T4")]
    assert _cause(nodes, [(0, 0, whole(1)), (1, 1, whole(1))], whole(2)) == "too few GPUs on one node"


def test_a_node_whose_cpu_is_exactly_the_pods_but_memory_short_is_short_of_memory():
    """g has the idle GPU and exactly the pod's CPU, but half its memory; big has CPU and memory but no free
    GPU: the cause is memory (not CPU, and big's memory does not count)."""
    nodes = [gpu_node("g", gpus=1, cpu_m=8000, memory_mib=16384), gpu_node("big", gpus=1, cpu_m=64_000)]
    pod = PodSpec(cpu_m=8000, memory_mib=32768, gpu=whole(1).gpu)
    assert _cause(nodes, [(1, 0, whole(1))], pod) == "memory"
    # exactly g's memory is enough memory: what rules the pod out is the GPU memory it asks for (90,000 MiB)
    pod = PodSpec(cpu_m=1000, memory_mib=16384, gpu=GpuRequest(1, 50, 90_000))
    assert _cause(nodes, [(1, 0, whole(1))], pod) == "GPU memory or task limit"


def test_a_gpu_with_exactly_the_cores_asked_is_room_and_other_models_room_is_not():
    """a: four A100s with 50, 40, 0 and 0 cores free (GPU 2 whole, GPU 3 shared); t: an idle T4. A pod for 50
    cores of an A100 has room on GPU 0 (exactly 50), so what rules it out is CPU; one for 60 cores has no
    room on an A100 (fragmentation), though the T4 has 100. Once every A100 is out of cores, a pod asking
    none (GPU memory only) has no room either: a card needs a core left to take a task."""
    nodes = [gpu_node("a", gpus=4, cpu_m=4000), gpu_node("t", gpus=1, model="T4")]
    taken = [(0, 0, fraction(50, 1024)), (0, 1, fraction(60, 1024)), (0, 2, whole(1))]
    taken += [(0, 3, fraction(50, 1024)), (0, 3, fraction(50, 1024))]

    def a100(cores: int, cpu_m: int = 500) -> PodSpec:
        return PodSpec(cpu_m=cpu_m, memory_mib=512, gpu=GpuRequest(1, cores, 1024), gpu_include=("A100",))

    assert _cause(nodes, taken, a100(50, cpu_m=8000)) == "CPU"
    assert _cause(nodes, taken, a100(60)) == "fragmentation"
    taken += [(0, 0, fraction(50, 1024)), (0, 1, fraction(40, 1024))]
    assert _cause(nodes, taken, a100(0)) == "fragmentation"


def _explained(nodes: list[NodeSpec], taken: list[tuple[int, int, PodSpec]], pod: PodSpec, profile=None) -> list[str]:
    """What `fairgpu explain` says of a workload of `pod` after `taken` (node, GPU, pod) and one cycle."""
    profile = profile or load_profile("fairgpu")
    s = Scheduler(nodes, QueueTree([QueueSpec("q")]), profile)
    for i, (node, slot, p) in enumerate(taken):
        s.state.assign(f"t{i}", s.state.placement_for(p, node, (slot,)))
    s.submit(job("w", "q", pod))
    s.cycle(0)
    assert "w" in s.pending
    return s.explain("w", 0).reasons


def test_a_mutex_pod_among_shared_gpus_is_told_no_set_of_free_gpus_meets_every_need():
    """Every GPU of n0 and n1 runs a 20-core task, so each has the cores and memory a 50-core pod asks, but a
    `mutex` pod takes only cards nobody uses; n2's idle GPUs lack the CPU. Each node is counted once."""
    nodes = [gpu_node("n0", gpus=2), gpu_node("n1", gpus=2), gpu_node("n2", gpus=2, cpu_m=500)]
    taken = [(n, g, fraction(20, 1024)) for n in (0, 1) for g in (0, 1)]
    pod = PodSpec(cpu_m=1000, memory_mib=512, gpu=GpuRequest(1, 50, 1024), gpu_policy="mutex")
    assert _explained(nodes, taken, pod) == [
        "no fit: 0/3 nodes: 2 no set of free GPUs meets every need, 1 insufficient CPU"
    ]


def test_a_plugin_filter_that_cannot_say_why_is_named_as_the_reason():
    """docs/architecture.md's Maintenance filter has no `reasons`: the nodes it rules out are counted under its
    name (two), the node Resources rules out under Resources' reason (one)."""
    from dataclasses import dataclass
    from typing import ClassVar

    from fairgpu.framework.interfaces import Filter
    from fairgpu.framework.profile import PluginEntry, parse_profile
    from fairgpu.plugins.registry import IN_TREE

    @dataclass(slots=True)
    class Maintenance:
        NAME: ClassVar[str] = "Maintenance"

        def filter(self, pod, view, mask) -> None:
            soon = np.array([n.labels.get("maintenance") == "soon" for n in view.state.nodes], dtype=bool)
            mask.restrict_nodes(~soon[mask.rows])

    profile = parse_profile(
        {"name": "m", "queueSort": "FairShare", "filter": ["Maintenance", "Resources"], "score": ["LeastAllocated"]},
        {**IN_TREE, "Maintenance": PluginEntry(Filter, Maintenance)},
    )
    soon = {"maintenance": "soon"}
    nodes = [gpu_node("a", labels=soon), gpu_node("b", cpu_m=500), gpu_node("c", labels=soon)]
    assert _explained(nodes, [], whole(1), profile) == ["no fit: 0/3 nodes: 2 Maintenance, 1 insufficient CPU"]


# -- framework/backfill.py, framework/preempting.py -----------------------------------------------------------------


def backfill_overran_a_gangs_hold() -> Scheduler:
    """n0 is held for an 8-GPU gang from t=1000; 'short' (stream queue, 30 s grace period) backfilled beside it
    at 500 and is still running when the hold comes due at 1000 (returned just before that cycle)."""
    stream = QueueSpec("stream", preemption=PreemptionPolicy(grace_period=30))
    queues = QueueTree([stream, QueueSpec("training", starvation_after=0)])
    s = Scheduler([gpu_node("n0"), gpu_node("n1")], queues, load_profile("fairgpu"))
    for name, node, gpus, end in (("long", 0, 7, 1000.0), ("other", 1, 8, 5000.0)):
        w = Workload(name, "training" if name == "other" else "stream", (whole(gpus),), duration=end)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, range(gpus))], started=0.0)
    s.submit(Workload("gang", "training", (whole(8),), duration=3600))
    s.cycle(0)
    s.submit(Workload("short", "stream", (whole(1),), submit_time=500, duration=50))
    assert s.cycle(500).started == ["short"]
    s.remove("long", finished_at=1000)
    return s


def test_a_gang_whose_backfill_overran_is_expected_when_the_backfills_grace_period_ends():
    """At 1000 the overrunning backfill is evicted with its queue's 30 s grace period: the gang is expected
    to start at 1030, not at 1000, and does."""
    s = backfill_overran_a_gangs_hold()
    assert [(e.workload, e.at) for e in s.cycle(1000).evictions] == [("short", 1030.0)]
    assert s.explain("gang", 1000).estimated_start == 1030
    s.remove("short")
    assert s.cycle(1030).started == ["gang"]


def test_a_victim_whose_eviction_was_refused_is_chosen_again_the_moment_its_back_off_ends():
    """b's one 8-GPU job is all a's 8-GPU reclaim can take. Its eviction is refused until t=110: at 101 there is
    no victim, and at 110 exactly, with nothing else changed since, it is evicted again."""
    b = PreemptionPolicy()
    sched = Scheduler([gpu_node("n0")], QueueTree([QueueSpec("a", guaranteed=_gpus(8)), QueueSpec("b", preemption=b)]),
                      load_profile("fairgpu"))  # fmt: skip
    sched.submit(Workload("x", "b", (whole(8),), duration=36000.0))
    sched.cycle(0)
    sched.submit(Workload("p", "a", (whole(8),), submit_time=100, duration=36000.0))
    assert [e.workload for e in sched.cycle(100).evictions] == ["x"]
    sched.eviction_refused("x", retry_at=110)
    assert sched.cycle(101).evictions == []
    assert [e.workload for e in sched.cycle(110).evictions] == ["x"]


def _gpus(n: float) -> np.ndarray:
    return r.quota_vector({"nvidia.com/gpu": n}, default=np.inf)


def test_an_elastic_workload_that_grew_into_a_held_node_is_charged_and_evicted_as_backfill_when_it_is_due():
    """n0 is held for the gang from t=1000 (long's end); its eighth GPU is busy until 600. 'e' (2 pods, runs
    with 1, declared 50 s) starts on n2 at 500 and grows into n0's freed GPU at 600 (it may: it is expected
    to end by 1000). Its queue is charged both pods; at 1000 it still runs, and as backfill in the gang's
    node it is evicted, so the gang is not kept waiting."""
    queues = QueueTree([QueueSpec("stream"), QueueSpec("training", starvation_after=0)])
    s = Scheduler([gpu_node("n0"), gpu_node("n1"), gpu_node("n2", gpus=1)], queues, load_profile("fairgpu"))
    for name, node, slots, end in (
        ("long", 0, range(7), 1000.0),
        ("filler", 0, [7], 600.0),
        ("other", 1, range(8), 5000.0),
    ):
        w = Workload(name, "training" if name == "other" else "stream", (whole(len(slots)),), duration=end)
        s.adopt(w, [s.state.placement_for(w.pods[0], node, slots)], started=0.0)
    s.submit(Workload("gang", "training", (whole(8),), duration=3600))
    s.cycle(0)
    s.submit(Workload("e", "stream", (whole(1),) * 2, submit_time=500, duration=50, min_pods=1))
    assert s.cycle(500).started == ["e"]
    s.remove("filler", finished_at=600)
    assert [(b.workload, s.state.node_names[b.placement.node]) for b in s.cycle(600).bound] == [("e", "n0")]
    assert s.view.usage[s.tree.index["stream"], r.DIM_GPU] == 9  # long's 7 and both of e's pods
    s.remove("long", finished_at=1000)
    assert [(e.workload, e.at) for e in s.cycle(1000).evictions] == [("e", 1000.0)]


# -- framework/victims.py -------------------------------------------------------------------------------------------


def test_a_preemption_in_a_cluster_running_mig_and_whole_card_pods_evicts_the_pod_on_the_card_it_needs():
    """b runs two 3g.20gb MIG pods on the MIG node and a whole-card pod on the ordinary node; its urgent
    whole-card job (b evicts its own lower priorities) can only have the ordinary card: that pod is evicted,
    the MIG pods keep running."""
    from fairgpu.model.mig import MigTemplate

    a100 = (
        MigTemplate("1g.5gb", 5120, 14, 1, tuple((i, 1) for i in range(7))),
        MigTemplate("3g.20gb", 20480, 42, 3, ((0, 4), (4, 4))),
    )
    card = GpuDevice("NVIDIA A100", 40960, "GPU-mig", split=7, mode="mig", mig=a100)
    nodes = [NodeSpec("mig", 64000, 256000, (card,)), gpu_node("plain", gpus=1)]
    queues = QueueTree([QueueSpec("b", preemption=PreemptionPolicy(within_queue="LowerPriority"))])
    sched = Scheduler(nodes, queues, load_profile("fairgpu"))
    mig_pod = PodSpec(cpu_m=100, memory_mib=100, gpu=GpuRequest(1, 0, 20480))
    for name, pod in (("m0", mig_pod), ("m1", mig_pod), ("w", whole(1))):
        sched.submit(Workload(name, "b", (pod,), duration=3600.0))
    assert len(sched.cycle(0.0).bound) == 3
    sched.submit(Workload("urgent", "b", (whole(1),), submit_time=10, priority=10, duration=3600.0))
    assert [e.workload for e in sched.cycle(10.0).evictions] == ["w"]


# -- framework/backlog.py: the order `fairgpu explain` gives in a queue shared fairly among its users ---------------


def _positions(running: list[tuple[str, int]], pending: list[tuple[str, str, int]]) -> list[str]:
    """The pending workloads of queue lab (fair among its users) by their explained position in it, after
    lab's `running` (user, GPUs) and the other queue's filling the rest of the 8-GPU node."""
    queues = QueueTree([QueueSpec("lab", fair_within="users"), QueueSpec("x")])
    s = Scheduler([gpu_node("n0")], queues, load_profile("fairgpu"))
    runs = [Workload(f"r{i}", "lab", (whole(g),), user=u) for i, (u, g) in enumerate(running)]
    used = sum(g for _, g in running)
    runs += [Workload("fill", "x", (whole(8 - used),))]
    for w in runs:
        s.submit(w)
    s.cycle(0)
    for t, (name, user, gpus) in enumerate(pending, 1):
        s.submit(Workload(name, "lab", (whole(gpus),), submit_time=t, user=user))
    s.cycle(10)
    assert sorted(s.pending) == sorted(name for name, _, _ in pending)
    return sorted(s.pending, key=lambda name: s.explain(name, 10).position_in_queue)


def test_in_a_queue_fair_among_users_the_user_holding_least_goes_next_counting_what_each_was_given():
    """Nobody in lab holds anything. u's first (1 GPU) goes first, being older; then v's 4-GPU job (v holds
    nothing yet, u 1 GPU); then u again (1 against v's 4), though v's second job is older than u's."""
    pending = [("u1", "u", 1), ("v1", "v", 4), ("v2", "v", 1), ("u2", "u", 1)]
    assert _positions([], pending) == ["u1", "v1", "u2", "v2"]


def test_in_a_queue_fair_among_users_a_newcomer_starts_from_nothing():
    """alice holds 3 GPUs; bob, who holds nothing yet, has his two 1-GPU jobs ahead of alice's (after both he
    holds 2)."""
    assert _positions([("alice", 3)], [("a1", "alice", 1), ("b1", "bob", 1), ("b2", "bob", 1)]) == ["b1", "b2", "a1"]


# -- framework/explain.py ----------------------------------------------------------------------------------------------


def test_a_workload_that_fits_but_has_not_had_its_turn_is_told_its_queues_share_with_past_usage():
    """a has held 4 of 8 GPUs for one half-life (3600 s): it holds 50 %, and its decayed past usage adds half
    of that, 25 %. Its new 1-GPU job fits, so the explanation (before the next cycle) is a's share against
    its entitlement: its demand, 5 of 8 GPUs."""
    sched = Scheduler([gpu_node("n0")], QueueTree([QueueSpec("a", usage_half_life=3600)]), load_profile("fairgpu"))
    sched.submit(Workload("run", "a", (whole(4),)))
    sched.cycle(0)
    sched.submit(Workload("new", "a", (whole(1),), submit_time=3600))
    assert sched.explain("new", 3600).reasons == [
        "fair share: waiting for its turn; queue a holds 50.0% of the cluster (with past usage 75.0%) against an"
        " entitlement of 62.5% (ratio 1.20)"
    ]


# -- framework/reconfigure.py ------------------------------------------------------------------------------------------


def test_work_of_a_deleted_queue_on_a_node_that_shrank_under_it_is_displaced_and_holds_nothing():
    """w (queue 'gone') runs a pod on GPUs 0-1 and one on GPUs 6-7 of n0. The queue is deleted and n0 now
    has 4 GPUs: w cannot be pinned where it ran, so it is displaced, and its first pod does not stay
    booked on GPUs 0-1 either."""
    from fairgpu.framework.reconfigure import carry_over, successor

    old = Scheduler([gpu_node("n0")], QueueTree([QueueSpec("q"), QueueSpec("gone")]), load_profile("fairgpu"))
    w = Workload("w", "gone", (whole(2), whole(2)))
    old.adopt(w, [old.state.placement_for(whole(2), 0, s) for s in ((0, 1), (6, 7))], started=0.0)
    new = successor(old, [gpu_node("n0", gpus=4)], QueueTree([QueueSpec("q")]), 10.0)
    carried = carry_over(old, new, {})
    assert carried.displaced == ["w"] and not carried.pinned
    assert int(new.state.node_idle_gpus[0]) == 4


# -- plugins/preemption.py: the five left open on main ad39af7 (line numbers here are 0a9c6b4's) ---------------------


def _adopted(
    queues: list[QueueSpec], nodes: list[NodeSpec], running: list[tuple[str, str, PodSpec, int, tuple, float]], **kw
) -> Scheduler:
    """A scheduler running (name, queue, pod, node, GPUs, started), adopted in this order."""
    s = Scheduler(nodes, QueueTree(queues), load_profile("fairgpu"))
    for name, queue, pod, node, slots, started in running:
        w = Workload(name, queue, (pod,), duration=36000.0, **kw.get(name, {}))
        s.adopt(w, [s.state.placement_for(pod, node, slots)], started=started)
    return s


def test_a_lower_priority_victim_goes_first_even_holding_the_most_work_against_one_started_this_instant():
    """b evicts its own lower priorities. 'old' (priority 0) has run 100 s on one GPU, the most work of any
    victim; 'new' (priority 1) started at this very instant, losing nothing. An urgent job needs one GPU:
    priority comes before work lost, so 'old' goes."""
    b = QueueSpec("b", preemption=PreemptionPolicy(within_queue="LowerPriority"))
    running = [("new", "b", whole(1), 0, (1,), 100.0), ("old", "b", whole(1), 0, (0,), 0.0)]
    s = _adopted([b], [gpu_node("n0", gpus=2)], running, new={"priority": 1})
    s.submit(Workload("urgent", "b", (whole(1),), submit_time=100, priority=5, duration=36000.0))
    assert [e.workload for e in s.cycle(100).evictions] == ["old"]


def test_work_lost_is_counted_in_gpus_not_gpu_memory():
    """Two victims of b's own lower priority: 'whole' has used a whole card (80 GiB) for 100 s, 'half' half a
    card's cores with 70 GiB for 150 s. In GPU-seconds 'half' loses less (75 against 100), in GPU memory it
    would lose more: 'half' goes. x's pod shares half's card and is no victim."""
    b = QueueSpec("b", preemption=PreemptionPolicy(within_queue="LowerPriority"))
    half = PodSpec(cpu_m=500, memory_mib=512, gpu=GpuRequest(1, 50, 71680))
    running = [
        ("whole", "b", whole(1), 0, (0,), 50.0),
        ("half", "b", half, 0, (1,), 0.0),
        ("x", "x", fraction(50, 10240), 0, (1,), 0.0),
    ]
    s = _adopted([b, QueueSpec("x")], [gpu_node("n0", gpus=2)], running)
    s.submit(Workload("p", "b", (fraction(50, 10240),), submit_time=150, priority=5, duration=36000.0))
    assert [e.workload for e in s.cycle(150).evictions] == ["half"]


def test_above_its_guarantee_a_queues_non_preemptible_work_may_be_reclaimed_whatever_its_place_in_the_tree():
    """As test_preemption_rules' lent case, with a listed third (after the lender b and an idle queue c): a
    (guarantee 2) runs four preemptible jobs from 0 s and four non-preemptible from 100 s, 8 GPUs in all;
    b reclaims one GPU, from the work that loses least: a non-preemptible one."""
    queues = [QueueSpec("b", guaranteed=_gpus(6)), QueueSpec("c"), QueueSpec("a", guaranteed=_gpus(2))]
    running = [(f"movable{i}", "a", whole(1), 0, (i,), 0.0) for i in range(4)]
    running += [(f"pinned{i}", "a", whole(1), 0, (4 + i,), 100.0) for i in range(4)]
    s = _adopted(queues, [gpu_node("n0")], running, **{f"pinned{i}": {"preemptible": False} for i in range(4)})
    s.submit(Workload("b0", "b", (whole(1),), submit_time=200, duration=36000.0))
    (evicted,) = s.cycle(200).evictions
    assert evicted.workload.startswith("pinned")


def test_fair_share_preemption_leaves_a_queue_exactly_at_its_share_alone():
    """9 GPUs, three queues of equal weight, each entitled to 3: b holds exactly 3, c holds 6 but its work is
    younger than c's min_runtime. a (fair-share preemption) has three 1-GPU jobs waiting: nobody may be
    evicted for them, b being at its share and not above it."""
    a = QueueSpec("a", preemption=PreemptionPolicy(fair_share=True))
    c = QueueSpec("c", preemption=PreemptionPolicy(min_runtime=3600))
    running = [(f"b{i}", "b", whole(1), 0, (i,), 0.0) for i in range(3)]
    running += [(f"c{i}", "c", whole(1), 0, (3 + i,), 500.0) for i in range(6)]
    s = _adopted([a, QueueSpec("b"), c], [gpu_node("n0", gpus=9)], running)
    for i in range(3):
        s.submit(Workload(f"a{i}", "a", (whole(1),), submit_time=1000, duration=36000.0))
    assert s.cycle(1000).evictions == []
    ent = s.view.entitled[:, r.DIM_GPU]
    assert [float(ent[s.tree.index[q]]) for q in "abc"] == [3.0, 3.0, 3.0]


def test_a_reclaim_takes_the_whole_workloads_of_the_queue_furthest_above_its_share_before_another_queues_extras():
    """a (guarantee 2) reclaims: b holds four 1-GPU jobs (4 against its entitled 3), c one elastic job grown to
    three pods (3 against 3). One GPU is free, a's job needs two: one of b's jobs goes, not c's extra pod,
    though extra pods go before whole workloads within a queue."""
    queues = [QueueSpec("a", guaranteed=_gpus(2)), QueueSpec("b"), QueueSpec("c")]
    running = [(f"b{i}", "b", whole(1), 0, (i,), 0.0) for i in range(4)]
    s = _adopted(queues, [gpu_node("n0")], running)
    e = Workload("e", "c", (whole(1),) * 3, duration=36000.0, min_pods=1)
    s.adopt(e, [s.state.placement_for(whole(1), 0, (4 + i,)) for i in range(3)], started=0.0)
    s.submit(Workload("a0", "a", (whole(2),), submit_time=100, duration=36000.0))
    (evicted,) = s.cycle(100).evictions
    assert evicted.workload.startswith("b")


def test_the_cluster_position_is_given_up_to_the_step_limit_and_none_past_it(monkeypatch):
    """With the dry run of the cluster order limited to 3 steps, the third of four waiting workloads is told
    its place (3) and the fourth, with 3 ahead of it, is past the limit (none: "> 3")."""
    from fairgpu.framework import explain

    monkeypatch.setattr(explain, "MAX_ORDER_STEPS", 3)
    s = Scheduler([gpu_node("n0", gpus=1)], QueueTree([QueueSpec("q")]), load_profile("fairgpu"))
    s.submit(Workload("run", "q", (whole(1),)))
    s.cycle(0)
    for i in range(4):
        s.submit(Workload(f"w{i}", "q", (whole(1),), submit_time=1 + i))
    assert [s.explain(f"w{i}", 10).position_in_cluster for i in range(4)] == [1, 2, 3, None]


def test_a_partly_placed_workload_reclaims_for_its_missing_pods_only():
    """A profile with preemption but no gang keeps a workload's pods as they fit. a (guarantee 2) asks for two
    1-GPU pods on a 2-GPU node where b borrows one: the first is placed, and reclaiming b's GPU for the second
    keeps a within its guarantee (1 held + 1 asked), so b's job is evicted."""
    from fairgpu.catalog import profile_from_dict

    profile = profile_from_dict(
        {"name": "t", "queueSort": "FairShare", "admit": ["Quota"], "filter": ["Resources"], "preempt": ["Preemption"]}
    )
    s = Scheduler([gpu_node("n0", gpus=2)], QueueTree([QueueSpec("a", guaranteed=_gpus(2)), QueueSpec("b")]), profile)
    s.submit(Workload("b0", "b", (whole(1),), duration=36000.0))
    s.cycle(0)
    s.submit(Workload("a0", "a", (whole(1), whole(1)), submit_time=10, duration=36000.0))
    result = s.cycle(10)
    assert [b.workload for b in result.bound] == ["a0"] and [e.workload for e in result.evictions] == ["b0"]


def test_in_a_cluster_without_gpus_the_queue_holding_less_goes_next_within_a_cycle():
    """CPU-only nodes: the GPU dimensions have no capacity and take no part in a queue's share. a's two jobs
    were submitted first, b's one after; with room for two, one of each starts (after a's first, a holds
    more than b)."""
    nodes = [NodeSpec("c0", 8000, 1 << 16)]
    s = Scheduler(nodes, QueueTree([QueueSpec("a"), QueueSpec("b")]), load_profile("fairgpu"))
    for name, queue, t in (("a1", "a", 1), ("a2", "a", 2), ("b1", "b", 3)):
        s.submit(Workload(name, queue, (PodSpec(cpu_m=4000, memory_mib=1024),), submit_time=t))
    assert sorted(s.cycle(10).started) == ["a1", "b1"]


# -- plugins/fragmentation.py ------------------------------------------------------------------------------------------


def test_fragmentation_with_max_shapes_1_keeps_the_first_shape_it_sees_and_only_that():
    """`max_shapes` bounds the workload mix FGD weighs: 1 is allowed, and then the shape first seen is the
    whole mix; a later, different shape is placed but not learned."""
    profile = _fragmentation(max_shapes=1)
    frag = profile.score[0][0]
    view = Scheduler([gpu_node("n0"), gpu_node("n1")], QueueTree([QueueSpec("q")]), profile).view
    for i, pod in enumerate((whole(1), whole(2), whole(1))):
        assert place_pod(pod, view, profile, key=f"p{i}") is not None
    assert frag._mix.pods == [whole(1)]
