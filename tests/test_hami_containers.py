"""fairgpu's own pods placed as HAMi's Fit places them (issue 12): several GPU containers, each fitted in turn
and written in its own segment; nvidia.com/numa-bind with several GPUs; cards whose devcore is not 100
(deviceCoreScaling). Engine cases, then the live path through the fake kubelet's Allocate double."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np

from fairgpu.catalog import load_profile
from fairgpu.framework.placement import place_pod
from fairgpu.framework.scheduler import Scheduler
from fairgpu.k8s import hami
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, QueueSpec, QueueTree
from fairgpu.model.mig import MigTemplate
from fairgpu.state import ClusterState
from fake_kubelet import GPU_MEM, SPLIT, FakeNodes
from test_live_scheduling import stop, until

MIB = 8192


def _engine(gpus: tuple[GpuDevice, ...], nodes: int = 1) -> Scheduler:
    specs = [NodeSpec(f"n{i}", 64000, 256000, gpus) for i in range(nodes)]
    return Scheduler(specs, QueueTree([QueueSpec("q")]), load_profile("fairgpu"))


def _req(count: int, cores: int, mem: int) -> GpuRequest:
    return GpuRequest(count=count, cores=cores, mem_mib=mem)


def test_gpu_containers_are_fitted_in_turn_and_may_share_a_card() -> None:
    """Two containers of 60 cores need two cards (the second sees the first's cores); two of 40 share one card
    when it is the only one, each entry its own task; a third container that fits nowhere fails the pod."""
    one = _engine((GpuDevice("NVIDIA", MIB, "g0"),))
    pod = PodSpec(gpu=_req(1, 40, 1000), more_gpus=(_req(1, 40, 2000),))
    p = place_pod(pod, one.view, one.profile)
    assert p is not None and p.slots == (0, 0) and p.cores == (40, 40) and p.mem_mib == (1000, 2000)
    assert p.segments == (1, 1)
    one.state.assign("x", p)
    assert one.state.gpu_tasks[0, 0] == 2 and one.state.gpu_cores_free[0, 0] == 20
    one.state.check_invariants()
    assert place_pod(PodSpec(gpu=_req(1, 60, 1), more_gpus=(_req(1, 60, 1),)), _engine(one.state.nodes[0].gpus).view,
                     one.profile) is None  # fmt: skip
    two = _engine((GpuDevice("NVIDIA", MIB, "g0"), GpuDevice("NVIDIA", MIB, "g1")))
    p = place_pod(PodSpec(gpu=_req(1, 60, 1), more_gpus=(_req(1, 60, 1),)), two.view, two.profile)
    assert p is not None and sorted(p.slots) == [0, 1]  # the old engine saw one 60-core container: one card
    # memory too: 6000 + 6000 MiB cannot share an 8192 MiB card, each alone could
    three = PodSpec(gpu=_req(1, 10, 6000), more_gpus=(_req(1, 10, 6000), _req(1, 10, 6000)))
    assert place_pod(three, two.view, two.profile) is None


def test_charge_counts_every_gpu_container() -> None:
    pod = PodSpec(gpu=_req(1, 50, 1000), more_gpus=(_req(2, 25, 500),))
    vec = pod.charge(MIB)
    assert vec[0] == 1.0 and vec[1] == 2000  # 0.5 + 2 × 0.25 GPUs; 1000 + 2 × 500 MiB


def test_numa_bind_keeps_each_containers_cards_on_one_numa_node() -> None:
    """HAMi's TestFit_NumaSwitching shape: g0 (NUMA 0) is busy, g1 (NUMA 0), g2 and g3 (NUMA 1) free. A NUMA-bound
    2-GPU container gets g2+g3 however the profile would order cards; with NUMA 1 down to one card it fits
    nowhere, while the same pod without numa-bind still does."""
    gpus = tuple(GpuDevice("NVIDIA", MIB, f"g{j}", numa=n) for j, n in enumerate((0, 0, 1, 1)))
    sched = _engine(gpus)
    sched.state.assign("busy", sched.state.placement_for(PodSpec(gpu=_req(1, 90, 100)), 0, (0,)))
    pod = PodSpec(gpu=_req(2, 50, 1000), numa_bind=True)
    p = place_pod(pod, sched.view, sched.profile)
    assert p is not None and sorted(p.slots) == [2, 3]
    sched.state.assign("numa1", sched.state.placement_for(PodSpec(gpu=_req(1, 100, 0)), 0, (3,)))
    assert place_pod(pod, sched.view, sched.profile) is None
    loose = place_pod(PodSpec(gpu=_req(2, 50, 1000)), sched.view, sched.profile)
    assert loose is not None and sorted(loose.slots) == [1, 2]  # across NUMA nodes: what numa-bind forbids


def test_devcore_other_than_100_follows_hamis_fit() -> None:
    """deviceCoreScaling 2 (devcore 200): two cores-100 tasks share the card (HAMi's exclusivity is only for a
    100-core card), a third does not fit; devcore 50: a cores-100 task never fits, a 50-core one does; cores 0
    cannot join a card whose 200 cores are taken."""
    st = ClusterState([NodeSpec("n", 64000, 256000, (GpuDevice("NVIDIA", MIB, "g", cores=200),))])
    exclusive = PodSpec(gpu=_req(1, 100, 1000))
    for key in ("a", "b"):
        p = st.placement_for(exclusive, 0, (0,))
        assert st.fits(p)
        st.assign(key, p)
    assert not st.fits(st.placement_for(exclusive, 0, (0,)))
    assert not st.fits(st.placement_for(PodSpec(gpu=_req(1, 0, 10)), 0, (0,)))
    assert not st.gpu_exclusive.any() and st.node_cores_free[0] == 0
    st.check_invariants()
    sched = _engine((GpuDevice("NVIDIA", MIB, "g", cores=200),), nodes=2)
    assert len(np.unique([p.node for p in _place_many(sched, exclusive, 4)])) == 2  # two per node, four in all
    assert _place_many(sched, exclusive, 1) == []
    half = _engine((GpuDevice("NVIDIA", MIB, "g", cores=50),))
    assert place_pod(exclusive, half.view, half.profile) is None
    assert place_pod(PodSpec(gpu=_req(1, 50, 10)), half.view, half.profile) is not None


def _place_many(sched: Scheduler, pod: PodSpec, n: int, prefix: str = "p") -> list:
    out = []
    for i in range(n):
        p = place_pod(pod, sched.view, sched.profile)
        if p is None:
            break
        sched.state.assign(f"{prefix}{i}", p)
        out.append(p)
    return out


def _node(name: str, cards: list[tuple[str, int, int]]) -> dict:
    """A HAMi node whose cards are (uuid, devcore, numa)."""
    devices = [
        hami.RegisteredGpu(u, SPLIT, GPU_MEM, cores, "NVIDIA A100-SXM4-80GB", numa, True, j)
        for j, (u, cores, numa) in enumerate(cards)
    ]
    return {
        "metadata": {"name": name, "annotations": {hami.NODE_REGISTER: hami.encode_register(devices)}},
        "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": str(len(cards) * SPLIT)}},
    }


def _pod(name: str, cards: str, containers: list[dict | None], annotations: dict | None = None) -> dict:
    """A pod of ours kept to `cards` (nvidia.com/use-gpuuuid, so each pod lands on the node its case needs)."""
    return {
        "metadata": {"name": name, "namespace": "a", "annotations": {hami.USE_GPUUUID: cards, **(annotations or {})}},
        "spec": {
            "schedulerName": "fairgpu",
            "containers": [
                {"name": f"c{i}", "image": "x", "resources": {"limits": c} if c else {}}
                for i, c in enumerate(containers)
            ],
        },
    }


def test_live_multi_container_numa_and_scaled_cores_pass_hamis_allocate(fake_api, tmp_path) -> None:
    """Through the controller, the binder and the fake kubelet's HAMi Allocate double: a pod with GPU containers
    around a sidecar gets one segment per container in container order (the kubelet pops them in turn and
    the limits equal HAMi's scheduler's); a NUMA-bound 2-GPU pod gets two cards of one NUMA node; two
    cores-100 pods share a devcore-200 card. No refusal, no over-committed card."""
    gpu = "nvidia.com/gpu"

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        nodes = {
            "multi": [("GPU-m0", 100, 0), ("GPU-m1", 100, 0)],
            "numa": [("GPU-n0", 100, 0), ("GPU-n1", 100, 1), ("GPU-n2", 100, 0), ("GPU-n3", 100, 1)],
            "scaled": [("GPU-s0", 200, 0)],
        }
        for name, cards in nodes.items():
            await port.create(NODES, _node(name, cards))
        on = {name: ",".join(u for u, _, _ in cards) for name, cards in nodes.items()}
        await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
        shared = {gpu: "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "1000"}
        pair = {gpu: "2", "nvidia.com/gpucores": "20", "nvidia.com/gpumem": "2000"}
        pods = [
            _pod("multi-p", on["multi"], [shared, None, pair]),
            _pod("numa-p", on["numa"], [{gpu: "2", "nvidia.com/gpucores": "10", "nvidia.com/gpumem": "500"}],
                 {hami.NUMA_BIND: "true"}),
            _pod("scaled-a", on["scaled"], [{gpu: "1", "nvidia.com/gpucores": "100", "nvidia.com/gpumem": "1000"}]),
            _pod("scaled-b", on["scaled"], [{gpu: "1", "nvidia.com/gpucores": "100", "nvidia.com/gpumem": "1000"}]),
        ]  # fmt: skip
        for obj in pods:
            await port.create(PODS, obj, "a")
        kubelet_nodes = FakeNodes(port)
        kubelet = asyncio.create_task(kubelet_nodes.run())
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: len(kubelet_nodes.allocations) == 4, 30, "HAMi's Allocate for all four pods")
            assert not kubelet_nodes.violations, kubelet_nodes.violations
            listed, _ = await port.list(PODS, "a")
            got = {o["metadata"]["name"]: o for o in listed}
            seg = {n: hami.decode_devices(o["metadata"]["annotations"][hami.ALLOCATED]) for n, o in got.items()}
            multi = seg["multi-p"]
            assert [len(s) for s in multi] == [1, 0, 2, 0]  # one segment per container, the sidecar's empty
            assert (multi[0][0].memory_mib, multi[0][0].cores) == (1000, 30)
            assert {(d.memory_mib, d.cores) for d in multi[2]} == {(2000, 20)}
            envs = kubelet_nodes.allocations["a/multi-p"].envs
            assert len(envs) == 2 and envs[1]["CUDA_DEVICE_SM_LIMIT"] == "20"
            numa = {u: n for u, _, n in nodes["numa"]}
            assert len({numa[d.uuid] for d in seg["numa-p"][0]}) == 1 and len(seg["numa-p"][0]) == 2
            assert [d.uuid for s in ("scaled-a", "scaled-b") for d in seg[s][0]] == ["GPU-s0", "GPU-s0"]
            assert kubelet_nodes.allocations["a/scaled-b"].envs[0]["CUDA_DEVICE_SM_LIMIT"] == "100"
        finally:
            await stop(port, run, kubelet)

    asyncio.run(asyncio.wait_for(go(), 60))


A100_MIG = (  # HAMi's a100MigProfiles (pkg/device/nvidia/mig_capability_test.go)
    hami.MigProfile("1g.5gb", 5120, 14, 1, tuple((i, 1) for i in range(7))),
    hami.MigProfile("2g.10gb", 10240, 28, 2, ((0, 2), (2, 2), (4, 2))),
    hami.MigProfile("3g.20gb", 20480, 42, 3, ((0, 4), (4, 4))),
)


def test_live_mig_cards_get_hamis_profiles_and_reservations_in_a_mixed_cluster(fake_api, tmp_path) -> None:
    """A MIG node (one A100-40GB in mode "mig" with HAMi's A100 profiles) beside an ordinary node. A pod HAMi
    placed holds 3g.20gb on slices 4–7. Ours: 10000 MiB gets 2g.10gb at 0, 5000 MiB gets 1g.5gb at 3 (1g
    profiles take the highest free start), each booked at the profile's memory and cores and reserved in
    hami.io/vgpu-mig-allocations as HAMi writes it, served by the Allocate double's MIG path; 20000 MiB finds
    no free 3g placement and is never bound; an ordinary pod lands on the ordinary node."""
    gpu, mem = "nvidia.com/gpu", "nvidia.com/gpumem"

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        mig = hami.RegisteredGpu("GPU-mig", 7, 40960, 100, "NVIDIA A100-SXM4-40GB", 0, True, 0, "mig", A100_MIG)
        mig_node = {
            "metadata": {"name": "mig", "annotations": {hami.NODE_REGISTER: hami.encode_register([mig])}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "7"}},
        }
        await port.create(NODES, mig_node)
        await port.create(NODES, _node("plain", [("GPU-p0", 100, 0)]))
        await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
        held = hami.encode_mig_allocations([hami.MigAllocation(0, 0, "GPU-mig", "3g.20gb", 4, 4)])
        foreign = {
            "metadata": {"name": "theirs", "namespace": "a", "annotations": {
                hami.VGPU_NODE: "mig", hami.ALLOCATED: "GPU-mig,NVIDIA,20480,42:;", hami.MIG_ALLOCATIONS: held,
                hami.BIND_PHASE: "success"}},
            "spec": {"schedulerName": "hami-scheduler", "nodeName": "mig",
                     "containers": [{"name": "c", "image": "x", "resources": {"limits": {gpu: "1", mem: "20000"}}}]},
            "status": {"phase": "Running"},
        }  # fmt: skip
        await port.create(PODS, foreign, "a")
        for name, mib in (("ten", "10000"), ("five", "5000")):
            await port.create(PODS, _pod(name, "GPU-mig", [{gpu: "1", mem: mib}]), "a")
        await port.create(PODS, _pod("plain", "GPU-p0", [{gpu: "1", mem: "1000"}]), "a")
        kubelet_nodes = FakeNodes(port)
        kubelet = asyncio.create_task(kubelet_nodes.run())
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: {"a/ten", "a/five", "a/plain"} <= set(kubelet_nodes.allocations), 30, "three pods")
            # created only now, so the order is certain: on an empty card a 3g.20gb fits at 0 and is legal; beside
            # the 2g at 0 and the 1g at 3, with the HAMi pod's 3g at 4, no 3g placement is free and it stays pending
            await port.create(PODS, _pod("twenty", "GPU-mig", [{gpu: "1", mem: "20000"}]), "a")
            await until(lambda: "a/twenty" in ctl.pods.cache, 10, "the 20000 MiB pod to be seen")
            await asyncio.sleep(1.5)  # a few passes of the controller's loop, which the new pod woke
            assert not kubelet_nodes.violations, kubelet_nodes.violations
            got = {o["metadata"]["name"]: o for o in (await port.list(PODS, "a"))[0]}
            assert not got["twenty"]["spec"].get("nodeName")
            ann = {n: got[n]["metadata"]["annotations"] for n in ("ten", "five", "plain")}
            assert ann["ten"][hami.ALLOCATED] == "GPU-mig,NVIDIA,10240,28:;"  # the profile's memory and cores
            assert ann["ten"][hami.MIG_ALLOCATIONS] == (
                '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-mig","profile":"2g.10gb",'
                '"placement":{"start":0,"size":2}}]'
            )
            assert [(a.profile, a.start) for a in hami.decode_mig_allocations(ann["five"][hami.MIG_ALLOCATIONS])] == [
                ("1g.5gb", 3)
            ]
            assert hami.MIG_ALLOCATIONS not in ann["plain"]
            assert kubelet_nodes.allocations["a/ten"].envs == [{"NVIDIA_VISIBLE_DEVICES": "MIG-GPU-mig-0-2"}]
            ctl.engine.state.check_invariants()
        finally:
            await stop(port, run, kubelet)

    asyncio.run(asyncio.wait_for(go(), 60))


def test_mig_profiles_are_picked_and_booked_within_the_card() -> None:
    """Engine level: HAMi's candidate order, each request booked at its profile, slices never shared; a request
    whose profile would book more memory than the card has left is refused (HAMi checks only the request's
    own memory and would over-book: a deliberate, safe difference), and the state stays consistent."""
    mig = tuple(MigTemplate(p.name, p.memory_mib, p.cores, p.slices, p.placements) for p in A100_MIG)
    sched = _engine((GpuDevice("NVIDIA A100", 12000, "g", split=7, mode="mig", mig=mig),))
    placed = _place_many(sched, PodSpec(gpu=_req(1, 0, 5000)), 1)
    assert [(p.mem_mib, p.cores, p.mig) for p in placed] == [((5120,), (14,), (0,))]  # 1g.5gb at the top slice
    assert sched.state.mig_busy[0, 0] == 1 << 6
    assert place_pod(PodSpec(gpu=_req(1, 0, 6000)), sched.view, sched.profile) is None  # 2g would book 10240
    more = _place_many(sched, PodSpec(gpu=_req(1, 0, 1000)), 3, "q")
    assert [p.mem_mib for p in more] == [(5120,)]  # one more 1g.5gb fits in the memory left, then none
    sched.state.check_invariants()
    sched.state.release("q0")
    assert sched.state.mig_busy[0, 0] == 1 << 6  # the first pod's slice stays held, the released one is free


def test_numa_bind_picks_hamis_numa_node_lowest_first_under_binpack_highest_first_otherwise() -> None:
    """Two free NUMA nodes of two cards each (g0, g1 on 0; g2, g3 on 1), on three nodes: a NUMA-bound 2-GPU
    container goes to NUMA 0 under `binpack` (HAMi's walk meets it first), to NUMA 1 under `spread` or no
    policy; when NUMA 0's cards are taken, a binpack one moves on to NUMA 1 of the same node."""
    gpus = tuple(GpuDevice("NVIDIA", MIB, f"g{j}", numa=n) for j, n in enumerate((0, 0, 1, 1)))
    sched = _engine(gpus, nodes=3)

    def cards(policy: str) -> tuple[int, list[int]]:
        p = place_pod(PodSpec(gpu=_req(2, 50, 1000), numa_bind=True, gpu_policy=policy), sched.view, sched.profile)
        assert p is not None
        return p.node, sorted(p.slots)

    assert cards("binpack")[1] == [0, 1]
    assert cards("spread")[1] == [2, 3]
    assert cards("")[1] == [2, 3]
    for node in range(3):  # NUMA 0 full everywhere
        sched.state.assign(f"numa0-{node}", sched.state.placement_for(PodSpec(gpu=_req(2, 100, 0)), node, (0, 1)))
    assert cards("binpack")[1] == [2, 3]


def test_each_container_books_its_share_of_the_card_for_the_next() -> None:
    """One card: containers asking 30 % and 50 % of its memory share it, 60 % and 50 % do not; with a task
    limit of one, two containers never share it; a container asking no cores joins a card with one core left."""
    card = (GpuDevice("NVIDIA", MIB, "g0"),)
    one = _engine(card)

    def pct(*shares: int) -> PodSpec:
        first, *more = (GpuRequest(1, 10, 0, s) for s in shares)
        return PodSpec(gpu=first, more_gpus=tuple(more))

    p = place_pod(pct(30, 50), one.view, one.profile)
    assert p is not None and p.slots == (0, 0)
    assert place_pod(pct(60, 50), one.view, one.profile) is None
    single = Scheduler([NodeSpec("n", 64000, 256000, card, split_count=1)], QueueTree([QueueSpec("q")]),
                       load_profile("fairgpu"))  # fmt: skip
    assert place_pod(pct(10, 10), single.view, single.profile) is None
    one.state.assign("most", one.state.placement_for(PodSpec(gpu=_req(1, 99, 100)), 0, (0,)))
    no_cores = PodSpec(gpu=_req(1, 0, 100), more_gpus=(_req(1, 0, 100),))
    p = place_pod(no_cores, one.view, one.profile)
    assert p is not None and p.slots == (0, 0)


def test_a_card_without_cores_to_share_takes_tasks_asking_for_none() -> None:
    """A card with devcore 0 (g0) takes a task asking for no cores, by either path; beside a card in use
    (g1, 30 cores taken) it scores 0 in HAMi's card score, as an empty card: binpack puts such a task on g1,
    spread on g0."""
    cards = (GpuDevice("NVIDIA", MIB, "g0", cores=0), GpuDevice("NVIDIA", MIB, "g1"))
    alone = _engine(cards[:1])
    for policy in ("", "binpack"):
        p = place_pod(PodSpec(gpu=_req(1, 0, 100), gpu_policy=policy), alone.view, alone.profile)
        assert p is not None and p.slots == (0,)
    both = _engine(cards)
    both.state.assign("used", both.state.placement_for(PodSpec(gpu=_req(1, 30, 100)), 0, (1,)))
    p = place_pod(PodSpec(gpu=_req(1, 0, 100), gpu_policy="binpack"), both.view, both.profile)
    assert p is not None and p.slots == (1,)
    p = place_pod(PodSpec(gpu=_req(1, 0, 100), gpu_policy="spread"), both.view, both.profile)
    assert p is not None and p.slots == (0,)


def test_hamis_card_order_stays_within_the_cards_the_other_filters_allow() -> None:
    """A binpack pod for A100s only on a node whose busiest card is a T4: HAMi's order would take the T4 first,
    but GpuType ruled it out, so the pod gets the A100."""
    cards = (GpuDevice("NVIDIA A100", MIB, "a"), GpuDevice("NVIDIA T4", MIB, "t"))
    sched = _engine(cards)
    sched.state.assign("t4", sched.state.placement_for(PodSpec(gpu=_req(1, 50, 100)), 0, (1,)))
    pod = PodSpec(gpu=_req(1, 10, 100), gpu_policy="binpack", gpu_include=("A100",))
    p = place_pod(pod, sched.view, sched.profile)
    assert p is not None and p.slots == (0,)
    assert place_pod(PodSpec(gpu=_req(1, 10, 100), gpu_policy="binpack"), sched.view, sched.profile).slots == (1,)


def test_mig_containers_fit_exactly_what_is_left_and_never_share_slices() -> None:
    """A 2-container pod of 5,000 MiB each: two 1g.5gb profiles (5,120 MiB, 14 cores each) fit a MIG card with
    exactly 10,240 MiB and 28 cores, not one MiB or one core less. Three 3g.20gb containers do not fit even a
    card with the memory and cores for three: the profile has two placements, and containers never share
    slices."""
    mig = tuple(MigTemplate(p.name, p.memory_mib, p.cores, p.slices, p.placements) for p in A100_MIG)

    def fits(pod: PodSpec, memory: int, cores: int = 100) -> bool:
        sched = _engine((GpuDevice("NVIDIA A100", memory, "g", split=7, mode="mig", mig=mig, cores=cores),))
        return place_pod(pod, sched.view, sched.profile) is not None

    two = PodSpec(gpu=_req(1, 0, 5000), more_gpus=(_req(1, 0, 5000),))
    assert fits(two, 10_240, 28) and not fits(two, 10_239) and not fits(two, 10_240, 27)
    three = PodSpec(gpu=_req(1, 0, 20_000), more_gpus=(_req(1, 0, 20_000),) * 2)
    assert fits(replace(three, more_gpus=three.more_gpus[:1]), 81_920, 200) and not fits(three, 81_920, 200)


def test_a_container_after_a_cores_100_one_may_share_its_mig_card_as_in_hami() -> None:
    """A cores-100 container on a MIG card is a 1g.5gb instance booked at 14 cores, not the card: HAMi's Fit
    refuses only another cores-100 task on a used 100-core card, so the pod's next container (30 cores) takes
    another instance of the same card (the only one). It was once refused, as if the card were whole."""
    mig = tuple(MigTemplate(p.name, p.memory_mib, p.cores, p.slices, p.placements) for p in A100_MIG)
    sched = _engine((GpuDevice("NVIDIA A100", 40960, "g", split=7, mode="mig", mig=mig),))
    pod = PodSpec(gpu=GpuRequest(1, 100, 5000), more_gpus=(GpuRequest(1, 30, 5000),))
    p = place_pod(pod, sched.view, sched.profile)
    assert p is not None and p.slots == (0, 0) and p.cores == (14, 14)
    assert sched.state.fits(p)


def test_a_whole_gpu_request_on_a_mig_card_is_a_mig_instance_too() -> None:
    """On an idle MIG card a request for 100 cores is fitted to a MIG profile like any other, not given the
    card: 5,000 MiB gets a 1g.5gb, booked at its 14 cores; asking for the card's whole memory finds no
    profile in this table, so it fits nowhere."""
    mig = tuple(MigTemplate(p.name, p.memory_mib, p.cores, p.slices, p.placements) for p in A100_MIG)
    sched = _engine((GpuDevice("NVIDIA A100", 40960, "g", split=7, mode="mig", mig=mig),))
    assert place_pod(PodSpec(gpu=GpuRequest(1, 100, 0)), sched.view, sched.profile) is None
    p = place_pod(PodSpec(gpu=GpuRequest(1, 100, 5000)), sched.view, sched.profile)
    assert p is not None and (p.cores, p.mem_mib, p.mig) == ((14,), (5120,), (0,))
