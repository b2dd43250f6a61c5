"""Tests added for mutants that bench/mutate.py found surviving (docs/testing.md lists them): each pins a
behaviour that no other test checked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import fraction, gpu_node, job, starving_gang_beside_a_stream, whole
from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.framework.placement import filter_breakdown, place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import GpuDevice, NodeSpec, PodSpec, QueueSpec, QueueTree, Workload
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
