"""The headline integration test, over HTTP against the fake apiserver: 20 HAMi nodes × 8 GPUs, three
queues, 300 pods (whole and fractional GPUs, two gangs). Fair first wave, exact HAMi annotations, no GPU
over-committed, a scheduler killed half-way and replaced, and injected 410/409/500/dropped watches."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter, defaultdict

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fairgpu.catalog import load_profile
from fairgpu.errors import KubeError
from fairgpu.k8s import hami
from fairgpu.k8s.app import dashboard_app
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from fairgpu.k8s.translate import pod_info
from fairgpu.observe.server import Beside
from fake_kubelet import GPU_MEM, SPLIT, FakeNodes

NODES_N, GPUS = 20, 8
TEAMS = ("a", "b", "c")


def node(i: int) -> dict:
    devices = [
        hami.RegisteredGpu(f"GPU-{i:02d}-{j}", SPLIT, GPU_MEM, 100, "NVIDIA A100-SXM4-80GB", index=j, healthy=True)
        for j in range(GPUS)
    ]
    return {
        "metadata": {"name": f"node-{i:02d}", "annotations": {hami.NODE_REGISTER: hami.encode_register(devices)}},
        "status": {"allocatable": {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": str(GPUS * SPLIT)}},
    }


def pod(ns: str, name: str, limits: dict, labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {
            "schedulerName": "fairgpu",
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits, "requests": {"cpu": "1"}}},
                {"name": "sidecar", "image": "y"},
            ],
        },
    }


def workload_pods() -> list[dict]:
    """300 pods: per team 30 × 1 GPU, 20 × 2 GPUs, 46 fractional (50 % cores, 20000 MiB); gangs in a and b."""
    out = []
    for t in TEAMS:
        out += [pod(t, f"one-{i}", {"nvidia.com/gpu": "1"}) for i in range(30)]
        out += [pod(t, f"two-{i}", {"nvidia.com/gpu": "2"}) for i in range(20)]
        frac = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "20000"}
        out += [pod(t, f"frac-{i}", frac) for i in range(46)]
    gang = {"fairgpu.io/pod-group": "g", "fairgpu.io/min-members": "4"}
    out += [pod("a", f"gang-{i}", {"nvidia.com/gpu": "2"}, gang) for i in range(4)]
    out += [pod("b", f"gang-{i}", {"nvidia.com/gpu": "1"}, gang) for i in range(4)]
    out += [pod("c", f"solo-{i}", {"nvidia.com/gpu": "1"}) for i in range(4)]
    return out


def gpu_equivalents(obj: dict) -> float:
    p = pod_info(obj)
    return p.spec.gpu.gpu_equivalents() if p.spec.gpu else 0.0


async def until(cond, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def stop(port, *tasks: asyncio.Task) -> None:
    """Cancel the test's controller and kubelet tasks, wait for them, and close the client."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await port.close()


def check_annotations_match_engine(ctl: Controller, pods: dict[str, dict]) -> int:
    """Each bound pod's HAMi annotation decodes to exactly the engine's placement; returns pods checked."""
    state = ctl.engine.state
    checked = 0
    for key, obj in pods.items():
        if not obj["spec"].get("nodeName"):
            continue
        placement = state.placement(key)
        assert placement is not None, f"{key} is bound but the engine does not account for it"
        ann = obj["metadata"]["annotations"]
        assert ann[hami.VGPU_NODE] == obj["spec"]["nodeName"] == state.node_names[placement.node]
        assert obj["metadata"]["labels"][hami.VGPU_NODE] == obj["spec"]["nodeName"]
        segments = hami.decode_devices(ann[hami.ALLOCATED])
        # main container, the sidecar's empty segment, and the empty one HAMi's decoder reads after the last ";"
        assert len(segments) == 3 and segments[1] == segments[2] == []
        gpus = state.nodes[placement.node].gpus
        want = [
            (gpus[s].uuid, m, c) for s, c, m in zip(placement.slots, placement.cores, placement.mem_mib, strict=True)
        ]
        assert [(d.uuid, d.memory_mib, d.cores) for d in segments[0]] == want
        p = pod_info(obj)
        assert len(segments[0]) == p.spec.gpu.count
        assert all(d.vendor == "NVIDIA" for d in segments[0])
        checked += 1
    return checked


def test_three_hundred_pods_fair_exact_crash_safe(fake_api, tmp_path):
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> None:
        port = await KubeClient.connect(kubeconfig)
        for i in range(NODES_N):
            await port.create(NODES, node(i))
        for t in TEAMS:
            await port.create(QUEUES, {"metadata": {"name": f"team-{t}"}, "spec": {"namespaces": [t], "weight": 1}})
        await port.create(QUEUES, {"metadata": {"name": "broken"}, "spec": {"weight": -1}})
        await port.create(QUEUES, {"metadata": {"name": "orphan"}, "spec": {"parent": "broken"}})
        all_pods = workload_pods()
        for obj in all_pods:
            await port.create(PODS, obj, obj["metadata"]["namespace"])
        nodes = FakeNodes(port)
        kubelet = asyncio.create_task(nodes.run())
        profile = load_profile("fairgpu")

        loop = asyncio.get_running_loop()
        # Phase 1: the cluster fills; the first wave must be fair between the three equal queues.
        ctl = Controller(port, profile)
        served = contextlib.AsyncExitStack()  # what `fairgpu run` serves, on the controller's loop as there
        dashboard = await served.enter_async_context(Beside(dashboard_app(ctl, "fake")))
        run = asyncio.create_task(ctl.run())

        def bound() -> dict[str, dict]:
            return {k: o for k, o in nodes.informer.cache.items() if o["spec"].get("nodeName")}

        def quiet() -> bool:
            return ctl.stats.cycles > 0 and not ctl.inflight and not ctl.wake.is_set() and len(bound()) > 0

        t0 = loop.time()
        await until(quiet, 60, "the first wave to bind")
        print(f"first wave bound in {loop.time() - t0:.1f}s")
        await asyncio.sleep(0.3)
        await until(quiet, 30, "the first wave to settle")
        first = bound()
        share = defaultdict(float)
        for o in first.values():
            share[o["metadata"]["namespace"]] += gpu_equivalents(o)
        total = NODES_N * GPUS
        assert sum(share.values()) >= 0.9 * total, share  # work-conserving: the cluster is (nearly) full
        for t in TEAMS:
            assert abs(share[t] - total / 3) <= 0.1 * total, share  # each queue within 10 % of an equal third
        assert check_annotations_match_engine(ctl, first) == len(first)
        # /metrics agrees with what is bound: cores allocated per GPU add up to the GPUs the pods hold.
        async with aiohttp.ClientSession() as http, http.get(f"{dashboard.url}/metrics") as resp:
            exposition = await resp.text()
        families = {f.name: f for f in text_string_to_metric_families(exposition)}
        cores = sum(smp.value for smp in families["fairgpu_gpu_cores_allocated_ratio"].samples)
        assert abs(cores - sum(share.values())) < 1e-6, (cores, sum(share.values()))
        scheduled = [
            smp.value
            for smp in families["fairgpu_schedule_attempts"].samples
            if smp.name.endswith("_total") and smp.labels["result"] == "scheduled"
        ]
        assert scheduled and scheduled[0] > 0
        assert families["fairgpu_leader_election_master_status"].samples[0].value == 1.0
        await served.aclose()
        assert not nodes.violations
        # HAMi's device plugin double served every bound pod its own record, with HAMi's scheduler's limits
        listed, _ = await port.list(PODS)
        bound_keys = {
            f"{o['metadata']['namespace']}/{o['metadata']['name']}" for o in listed if o["spec"].get("nodeName")
        }
        served_ok = {k for k, a in nodes.allocations.items() if a.served == k and a.success}
        assert bound_keys and bound_keys <= served_ok, sorted(bound_keys - served_ok)[:5]
        events, _ = await port.list(PODS.__class__("", "v1", "events", True))
        assert any(e["reason"] == "FailedScheduling" and e["message"] for e in events)
        assert any(e["reason"] == "Scheduled" for e in events)
        # a pending pod carries the engine's explanation as PodScheduled=False, the same text as its event
        explained = defaultdict(set)
        for e in events:
            explained[(e["involvedObject"]["namespace"], e["involvedObject"]["name"])].add(e["message"])
        pending, _ = await port.list(PODS, field_selector="spec.nodeName=")
        conditions = [
            (p, c)
            for p in pending
            for c in p.get("status", {}).get("conditions", [])
            if c["type"] == "PodScheduled" and c["status"] == "False"
        ]
        assert conditions and all(c["reason"] == "Unschedulable" for _, c in conditions)
        p, c = conditions[0]
        assert c["message"] and c["message"] in explained[(p["metadata"]["namespace"], p["metadata"]["name"])]
        await asyncio.sleep(ctl.status_every)
        ctl.wake.set()
        await until(
            lambda: "team-a" in ctl.reporter.queue_last and ctl.reporter.queue_last["team-a"]["admitted"],
            10,
            "queue status",
        )
        await asyncio.sleep(0.2)
        status = (await port.get(QUEUES, "team-a"))["status"]
        assert status["pending"] > 0 and status["admitted"] > 0
        assert abs(float(status["usage"]["nvidia.com/gpu"]) - share["a"]) < 0.01
        assert float(status["fairShare"]["nvidia.com/gpu"]) > 0
        queue = await port.get(QUEUES, "broken")
        assert queue["status"]["conditions"][0]["status"] == "False"
        assert "spec.weight" in queue["status"]["conditions"][0]["message"]
        orphan = (await port.get(QUEUES, "orphan"))["status"]["conditions"][0]
        assert orphan["status"] == "False" and "spec.parent" in orphan["message"]

        # Phase 2: pods complete in waves; faults are injected; the scheduler is killed half-way.
        fake_api.control("fault", code=409, count=1, path_contains="/binding")
        fake_api.control("fault", code=500, count=6, verb="POST")
        done: set[str] = set()

        async def complete(keys: list[str]) -> None:
            for key in keys:
                ns, name = key.split("/", 1)
                try:
                    await port.delete(PODS, name, ns)
                except KubeError as err:
                    assert err.code == 404
                done.add(key)

        await complete(sorted(first)[: len(first) // 2])
        await asyncio.sleep(0.2)
        fake_api.control("compact")
        fake_api.control("expire-watches")  # forced 410 on every watch
        await asyncio.sleep(0.2)
        await complete([k for k in sorted(bound()) if k not in done][:-10])  # ten keep running across the kill
        await asyncio.sleep(0.1)
        run.cancel()  # killed mid-flight: binds may be half done
        await asyncio.gather(run, return_exceptions=True)
        survivors = set(bound()) - done
        fake_api.control("drop-watches")

        ctl = Controller(port, profile)
        run = asyncio.create_task(ctl.run())
        print(f"phase 2 restarted at {loop.time() - t0:.1f}s")
        # The successor charges what each queue holds, including pods its predecessor bound.
        await until(quiet, 60, "the successor to settle")
        usage = ctl.engine.view.usage
        # ... as running workloads of their queues, so reclaim and fair-share preemption can take them back
        assert survivors and all(ctl.owned.get(k) in ctl.engine.running for k in survivors - done), survivors
        for t in TEAMS:
            mine = [o for o in ctl.pods.cache.values() if o["metadata"]["namespace"] == t]
            held = sum(gpu_equivalents(o) for o in mine if o["spec"].get("nodeName"))
            assert abs(usage[ctl.engine.tree.index[f"team-{t}"], 0] - held) < 1e-6, (t, held)
        end = loop.time() + 90
        while len(done) < len(all_pods):  # the rest run and complete as they are bound
            if loop.time() > end:
                waiting = sorted(set(nodes.informer.cache) - done - set(bound()))
                why = {k: ctl.reporter.last.get(k) for k in waiting}
                raise AssertionError(
                    f"{len(done)} of {len(all_pods)} ran; {why}; owned {[ctl.owned.get(k) for k in waiting]}"
                )
            live = [k for k in bound() if k not in done]
            if live:
                await complete(live)
            await asyncio.sleep(0.05)
        await until(lambda: not ctl.inflight, 30, "binds to finish")
        print(f"all done at {loop.time() - t0:.1f}s")

        state = json.loads(json.dumps(fake_api.control("state")))
        ok = Counter((b["namespace"], b["name"]) for b in state["bindings"] if b["code"] == 201)
        assert len(ok) == len(all_pods), f"{len(ok)} of {len(all_pods)} pods bound"
        assert max(ok.values()) == 1, [k for k, n in ok.items() if n > 1]  # no pod bound twice
        assert all(f["count"] == 0 for f in state["faults"])  # the injected 409 and 500s all hit, and were survived
        assert ctl.stats.rebuilds >= 1 and ctl.pods.relists >= 1
        assert not nodes.violations, nodes.violations[:5]

        await stop(port, run, kubelet)

    asyncio.run(asyncio.wait_for(go(), 240))


def test_cycles_follow_engine_changes_not_events(fake_api, tmp_path):
    """Pod writes that change nothing the engine reads (a label, the kubelet's status) cost no cycle; work
    that waits is still tried again every `retry_every` seconds without news."""

    fake_api.control("device-plugin")  # each bind's allocation is consumed and the node lock released

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
        for i in range(GPUS + 1):  # one more than fits: it waits
            await port.create(PODS, pod("a", f"p{i}", {"nvidia.com/gpu": "1"}), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        ctl.retry_every = 0.5
        run = asyncio.create_task(ctl.run())
        await until(lambda: ctl.stats.binds == GPUS and not ctl.inflight, 20, "the node to fill")
        await asyncio.sleep(0.6)
        loop = asyncio.get_running_loop()
        before, began = ctl.stats.cycles, loop.time()
        for i in range(40):  # writes to running pods that the engine does not read, one every 30 ms
            await port.patch(PODS, f"p{i % GPUS}", {"metadata": {"labels": {"touched": str(i)}}}, "a")
            await asyncio.sleep(0.03)
        await asyncio.sleep(0.3)
        retries = (loop.time() - began) / ctl.retry_every
        assert 1 <= ctl.stats.cycles - before <= retries + 2, (ctl.stats.cycles - before, retries)  # not 40
        assert len(ctl.engine.pending) == 1
        # room: the waiting pod goes at once (which pod waits depends on the order of equal creation times)
        done = next(o["metadata"]["name"] for o in ctl.pods.cache.values() if o["spec"].get("nodeName"))
        await port.delete(PODS, done, "a")
        await until(lambda: ctl.stats.binds == GPUS + 1, 5, "the waiting pod to be bound")
        await stop(port, run)

    asyncio.run(asyncio.wait_for(go(), 60))


def test_running_pods_whose_queue_is_gone_keep_their_room(fake_api, tmp_path):
    """Pods of ours running when their queue is deleted are no workload of any queue any more, but their
    GPUs stay taken: the rebuilt engine pins them where they run instead of losing them."""
    fake_api.control("device-plugin")

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
        await port.create(QUEUES, {"metadata": {"name": "other"}, "spec": {"namespaces": ["b"]}})
        for i in range(3):
            await port.create(PODS, pod("a", f"p{i}", {"nvidia.com/gpu": "2"}), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 3 and not ctl.inflight, 20, "the pods to be bound")
            assert set(ctl.owned) == {"a/p0", "a/p1", "a/p2"} and not ctl.fixed
            await port.delete(QUEUES, "q")
            await until(lambda: len(ctl.fixed) == 3, 20, "the rebuilt engine to pin the pods")
            assert not ctl.owned and not ctl.engine.running
            assert int(ctl.engine.state.node_idle_gpus[0]) == GPUS - 6
        finally:
            await stop(port, run)

    asyncio.run(asyncio.wait_for(go(), 60))


def test_with_no_queue_yet_pods_are_told_why_and_run_once_one_exists(fake_api, tmp_path):
    """A fresh install has pods before any Queue: the controller must still tell each pod why it waits, run it
    once a queue serves its namespace, and keep its GPUs taken when the LAST queue is deleted. An empty queue
    tree used to fail to build (a numpy reshape of nothing), so the controller skipped every pass: no reason,
    and the deleted queue's engine kept running."""
    fake_api.control("device-plugin")

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        await port.create(PODS, pod("a", "p0", {"nvidia.com/gpu": "2"}), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:

            async def reason() -> str:
                conds = ((await port.get(PODS, "p0", "a")).get("status") or {}).get("conditions") or []
                return next((c["message"] for c in conds if c["type"] == "PodScheduled" and c["status"] == "False"), "")

            loop = asyncio.get_running_loop()
            end = loop.time() + 20
            while "no queue serves namespace a" not in (why := await reason()):
                assert loop.time() < end, f"the queueless pod's reason is {why!r}"
                await asyncio.sleep(0.1)
            await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 20, "the pod to be bound")
            await port.delete(QUEUES, "q")
            await until(lambda: len(ctl.fixed) == 1, 20, "the rebuilt engine to pin the pod")
            assert int(ctl.engine.state.node_idle_gpus[0]) == GPUS - 2
        finally:
            await stop(port, run)

    asyncio.run(asyncio.wait_for(go(), 60))
