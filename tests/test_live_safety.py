"""Issue 11, controller side, over HTTP against the fake apiserver: a GPU is never booked twice after a
failed bind, a gang runs whole or not at all, one leader binds at a time (audited from the fake's request
log), informers are supervised and seen by /readyz, labels stay valid, evictions name their pod's UID."""

from __future__ import annotations

import asyncio

import pytest

from audit import audit
from chaos import chaos_node, chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.errors import KubeError
from fairgpu.k8s import hami
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.events import AGGREGATE_MAX, COMBINED, SPAM_BURST, EventRecorder
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.port import NODES, PODS, QUEUES
from test_live_scheduling import until

GANG = {"fairgpu.io/pod-group": "g", "fairgpu.io/min-members": "2"}
ONE = {"nvidia.com/gpu": "1"}
TINY = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "5", "nvidia.com/gpumem": "100"}


async def setup(port, nodes: int, gpus: int, tenants: tuple[str, ...] = ("a", "b")) -> None:
    for i in range(nodes):
        await port.create(NODES, chaos_node(i, gpus))
    for t in tenants:
        await port.create(QUEUES, {"metadata": {"name": f"q-{t}"}, "spec": {"namespaces": [t]}})


def pods_now(fake_api) -> dict[str, dict]:
    def read() -> dict[str, dict]:
        return {
            f"{o['metadata']['namespace']}/{o['metadata']['name']}": o
            for o in fake_api.api.store.objects.values()
            if o.get("kind") == "Pod"
        }

    return fake_api.call(read)


def test_failed_gang_bind_books_nothing_twice_and_the_gang_runs_whole(fake_api, tmp_path):
    """Finding 1: gang-0's Binding fails five times (the client's every attempt) while gang-1's is still in
    flight; another tenant's pod arrives meanwhile. Before: both GPUs were freed, gang-1 landed, b0 was
    bound to a GPU of the gang and gang-0 was resubmitted alone. Now the gang's room is held until every
    bind of it has resolved, gang-0 is bound again in it, and b0 waits."""
    fake_api.control("device-plugin")
    fake_api.control("fault", code=500, count=5, verb="POST", path_contains="/pods/gang-0/binding")
    fake_api.control("delay", seconds=1.5, verb="POST", path_contains="/pods/gang-1/binding")

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        for i in range(2):
            await port.create(PODS, chaos_pod("a", f"gang-{i}", ONE, GANG), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            tried = lambda: any("gang-0/binding" in r["path"] for r in fake_api.control("requests")["requests"])  # noqa: E731
            await until(tried, 10, "gang-0's first bind")
            await port.create(PODS, chaos_pod("b", "b0", ONE), "b")
            await asyncio.sleep(4.0)  # gang-1 lands, gang-0's failures are over, b0 had every chance
            await until(lambda: not ctl.inflight, 10, "binds to settle")
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await port.close()

    asyncio.run(asyncio.wait_for(go(), 60))
    report = audit(fake_api.api.store, fake_api.control("requests")["requests"], {}, set())
    assert not report.overcommit, report.overcommit
    assert not report.partial_gangs, report.partial_gangs
    pods = pods_now(fake_api)
    assert pods["a/gang-0"]["spec"].get("nodeName") and pods["a/gang-1"]["spec"].get("nodeName")
    assert not pods["b/b0"]["spec"].get("nodeName")


def test_a_bind_whose_answer_was_lost_counts_as_landed(fake_api, tmp_path):
    """The Binding is committed but its answer lost (connection dropped), and the client's retries are all
    refused: the controller reads the pod, finds it bound where it put it, and rolls nothing back."""
    fake_api.control("device-plugin")
    fake_api.control("fault", code=0, count=1, verb="POST", path_contains="/pods/p0/binding", after=True)
    fake_api.control("fault", code=503, count=4, verb="POST", path_contains="/pods/p0/binding")

    async def go() -> Controller:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        await port.create(PODS, chaos_pod("a", "p0", ONE), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1 and not ctl.inflight, 10, "the bind")
            await port.create(PODS, chaos_pod("b", "b0", ONE), "b")
            await until(lambda: ctl.stats.binds == 2 and not ctl.inflight, 10, "b0's bind")
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await port.close()
        return ctl

    ctl = asyncio.run(asyncio.wait_for(go(), 60))
    assert ctl.stats.rollbacks == 0 and ctl.stats.bind_failures == 1
    report = audit(fake_api.api.store, fake_api.control("requests")["requests"], {}, set())
    assert not report.overcommit, report.overcommit
    state = fake_api.control("state")
    assert state["injected"] == {"after 0": 1, "before 503": 4}


def test_two_replicas_never_bind_in_the_same_lease_window(fake_api, tmp_path):
    """Finding 3: the leader's lease requests stall (5 s each, a slow path to the API server) while its
    other requests flow. Before: it went on binding for seconds after the standby had taken over. Now
    its renewal gives up at its deadline, it steps down and cancels its binds before the lease can expire
    on the standby's clock. Audited from the fake's request log: every Binding was written by the
    lease's holder of that moment."""
    fake_api.control("device-plugin")
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> dict[str, int]:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=40, gpus=4)
        replicas = []
        for ident in ("r1", "r2"):
            rport = await KubeClient.connect(kubeconfig)
            rport.api.user_agent = f"fairgpu/{ident}"
            elector = LeaderElector(rport, "fairgpu-system", "fairgpu", ident, 3.0, 0.25, 2.0)
            ctl = Controller(rport, load_profile("fairgpu"), leadership=elector)
            replicas.append((elector, ctl, [asyncio.create_task(elector.run()), asyncio.create_task(ctl.run())]))
        await until(lambda: any(e.leading.is_set() for e, _, _ in replicas), 10, "a leader")
        leader = next(e for e, _, _ in replicas if e.leading.is_set())
        created = 0

        async def arrive(n: int) -> None:  # a steady stream of pods that finish at once: binds never stop
            nonlocal created
            for _ in range(n):
                await port.create(
                    PODS,
                    chaos_pod(
                        "a",
                        f"p{created}",
                        {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "5", "nvidia.com/gpumem": "100"},
                    ),
                    "a",
                )
                created += 1
                await asyncio.sleep(0.02)

        await arrive(50)
        fake_api.control("delay", seconds=5.0, path_contains="/leases/", agent_contains=f"fairgpu/{leader.identity}")
        await arrive(400)  # ~10 s
        for _, _, tasks in replicas:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await port.close()
        return {e.identity: c.stats.binds for e, c, _ in replicas}

    binds = asyncio.run(asyncio.wait_for(go(), 60))
    requests = fake_api.control("requests")["requests"]
    report = audit(fake_api.api.store, requests, {}, set())
    assert not report.non_leader_binds, report.non_leader_binds[:5]
    assert all(n > 0 for n in binds.values()), binds  # the standby did take over and bind


def test_a_failing_informer_restarts_and_readiness_shows_it(fake_api, tmp_path):
    """Finding 10: an informer's task that dies (a handler's bug) left /readyz green and the controller
    blind. Now the informer is supervised: readiness is False while it fails, it starts over with a fresh
    list, and the pod it failed on is scheduled."""
    fake_api.control("device-plugin")
    failing = {"on": True}

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        ctl = Controller(port, load_profile("fairgpu"))
        handler = ctl.pods.handler

        def flaky(kind: str, obj: dict) -> None:
            if failing["on"] and obj["metadata"]["name"] == "boom":
                raise RuntimeError("handler bug")
            handler(kind, obj)

        ctl.pods.handler = flaky
        run = asyncio.create_task(ctl.run())
        try:
            await until(ctl.synced, 10, "the caches to sync")
            await port.create(PODS, chaos_pod("a", "boom", ONE), "a")
            await until(lambda: not ctl.synced(), 5, "readiness to drop")
            failing["on"] = False
            await until(ctl.synced, 10, "readiness to come back")
            await until(lambda: ctl.stats.binds == 1, 10, "boom to be bound")
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await port.close()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_vgpu_node_label_stays_a_valid_label_value(fake_api, tmp_path):
    """Finding 10: the hami.io/vgpu-node label held the node name, which may be longer than a label value's
    63 characters (a real apiserver refuses the patch). The annotation keeps the whole name."""
    fake_api.control("device-plugin")
    long_name = "gpu-node-" + "x" * 70 + ".cluster.example.com"

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=0, gpus=2)
        node = chaos_node(0, 2)
        node["metadata"]["name"] = long_name
        await port.create(NODES, node)
        await port.create(PODS, chaos_pod("a", "p0", ONE), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1, 10, "the bind")
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await port.close()

    asyncio.run(asyncio.wait_for(go(), 30))
    meta = pods_now(fake_api)["a/p0"]["metadata"]
    label = meta["labels"][hami.VGPU_NODE]
    assert len(label) <= 63 and label.startswith("gpu-node-xxx") and label != long_name[:63]
    assert meta["annotations"][hami.VGPU_NODE] == long_name
    assert hami.label_value("node-1") == "node-1"
    assert hami.label_value(long_name) != hami.label_value(long_name + "2")


def test_an_eviction_never_takes_a_new_pod_of_the_same_name(fake_api, tmp_path):
    """Finding 10: evictions carry the victim's UID; a pod recreated under its name is not evicted."""

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        old = await port.create(PODS, chaos_pod("a", "v", ONE), "a")
        await port.delete(PODS, "v", "a")
        new = await port.create(PODS, chaos_pod("a", "v", ONE), "a")
        with pytest.raises(KubeError) as refused:
            await port.evict("a", "v", 0, old["metadata"]["uid"])
        assert refused.value.code == 409
        assert (await port.get(PODS, "v", "a"))["metadata"]["uid"] == new["metadata"]["uid"]
        await port.evict("a", "v", 0, new["metadata"]["uid"])
        with pytest.raises(KubeError):
            await port.get(PODS, "v", "a")
        await port.close()

    asyncio.run(asyncio.wait_for(go(), 30))


class RecordingPort:
    def __init__(self) -> None:
        self.created: list[dict] = []
        self.patched: list[tuple[str, dict]] = []

    async def create(self, kind, body, namespace=None):
        self.created.append(body)
        return body

    async def patch(self, kind, name, body, namespace=None, subresource=None):
        self.patched.append((name, body))
        return body


def test_events_are_counted_aggregated_and_rate_limited_like_client_go():
    """Finding 10: one Event per message, never aggregated. Now a repeat bumps the count of the event
    already written, more than AGGREGATE_MAX different messages of one reason become one combined event,
    and an object gets at most SPAM_BURST events in a burst."""
    port = RecordingPort()
    now = [0.0]
    rec = EventRecorder(port, "fairgpu", clock=lambda: now[0])

    async def emit(name: str, message: str) -> None:
        observed = rec.observe("a", name, "uid-" + name, "FailedScheduling", message, "Warning")
        if observed is not None:
            await rec.write(*observed)

    async def go() -> None:
        for _ in range(5):
            await emit("same", "no room")
        for i in range(AGGREGATE_MAX + 5):
            await emit("varied", f"no room on {i} nodes")
        for i in range(SPAM_BURST + 10):
            await emit("spam", "waiting" if i % 2 else "still waiting")

    asyncio.run(go())
    same = [e for e in port.created if e["involvedObject"]["name"] == "same"]
    assert len(same) == 1 and [b["count"] for n, b in port.patched if n == same[0]["metadata"]["name"]] == [2, 3, 4, 5]
    varied = [e for e in port.created if e["involvedObject"]["name"] == "varied"]
    assert len(varied) == AGGREGATE_MAX + 1 and varied[-1]["message"].startswith(COMBINED)
    combined = [b for n, b in port.patched if n == varied[-1]["metadata"]["name"]]
    assert [b["count"] for b in combined] == [2, 3, 4, 5] and combined[-1][
        "message"
    ] == COMBINED + "no room on 14 nodes"
    spam_writes = [e for e in port.created if e["involvedObject"]["name"] == "spam"]
    spam_writes += [b for n, b in port.patched if n.startswith("spam.")]
    assert len(spam_writes) == SPAM_BURST and rec.dropped == 10
    now[0] += 300.0  # one token back after SPAM_EVERY
    asyncio.run(emit("spam", "waiting"))
    assert rec.dropped == 10


def test_leader_election_timings_follow_client_go():
    with pytest.raises(ValueError, match="leaseDuration"):
        LeaderElector(None, "ns", "l", "me", lease_duration=3.0, retry_period=0.5, renew_deadline=3.0)
    with pytest.raises(ValueError, match="retryPeriod"):
        LeaderElector(None, "ns", "l", "me", lease_duration=3.0, retry_period=2.0, renew_deadline=2.0)


def test_a_new_leaders_fresh_list_survives_a_failed_list(fake_api, tmp_path):
    """A new leader waits for a fresh list of pods before deciding. When that list failed (the client's
    five attempts all refused), the request for it was dropped and the leader waited for ever."""

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(PODS, chaos_pod("a", "p0", ONE), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        task = asyncio.create_task(ctl.pods.run())
        try:
            await until(ctl.pods.synced.is_set, 10, "the first list")
            fake_api.control("fault", code=500, count=5, verb="GET", path_contains="/api/v1/pods")
            await port.create(PODS, chaos_pod("a", "p1", ONE), "a")
            await asyncio.wait_for(ctl.pods.resync(), 10)
            assert set(ctl.pods.cache) == {"a/p0", "a/p1"}
            assert fake_api.control("state")["injected"] == {"before 500": 5}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await port.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_node_locks_left_by_a_leader_that_died_mid_bind_do_not_hold_nodes(fake_api, tmp_path):
    """The long soak's stall: a leader that loses its lease (or dies) mid-bind has taken HAMi's node lock and
    never releases it. Before, the lock held its node for HAMi's whole expiry (5 min) while its owner pod
    existed: leaders flapping under load left 35 of 40 nodes locked and binding stopped. Now a lock is stale
    when its owner is bound to another node (node-0: x was bound to node-1 by the next leader), or is one of
    ours that this leader is not binding to that node: z cannot be placed now (node-4); c and d are being
    bound each to the node the other one locked (node-2, node-3: with only "not in flight" as the test, each
    waited for the other). Every pod placeable is bound within seconds."""
    fake_api.control("device-plugin")
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    def on(slot: str, name: str) -> dict:
        p = chaos_pod("a", name, ONE)
        p["spec"]["nodeSelector"] = {"slot": slot}
        return p

    async def go() -> dict[str, dict]:
        port = await KubeClient.connect(kubeconfig)
        for i in range(5):
            n = chaos_node(i, 1)
            n["metadata"]["labels"] = {"slot": str(i)}
            await port.create(NODES, n)
        await port.create(QUEUES, {"metadata": {"name": "q-a"}, "spec": {"namespaces": ["a"]}})
        x = on("1", "x")
        x["spec"]["nodeName"] = "node-001"
        alloc = hami.encode_devices([[hami.DeviceUse("GPU-001-0", hami.VENDOR, 40960, 100)]])
        x["metadata"]["annotations"] = {hami.ALLOCATED: alloc, hami.TO_ALLOCATE: alloc}
        for p in (x, on("nowhere", "z"), on("3", "c"), on("2", "d")):
            await port.create(PODS, p, "a")
        taken = Controller(port, load_profile("fairgpu")).binder.clock()
        for node, owner in (("node-000", "x"), ("node-002", "c"), ("node-003", "d"), ("node-004", "z")):
            lock = hami.NodeLock(taken, "a", owner).encode()
            await port.patch(NODES, node, {"metadata": {"annotations": {hami.NODE_LOCK: lock}}})
        ctl = Controller(port, load_profile("fairgpu"))
        task = asyncio.create_task(ctl.run())
        try:
            for slot, name in (("0", "y"), ("4", "w")):
                await port.create(PODS, on(slot, name), "a")
            where = lambda: {n: (ctl.pods.cache.get(f"a/{n}") or {}).get("spec", {}).get("nodeName") for n in "ywcd"}  # noqa: E731
            await until(lambda: all(where().values()), 15, "y, w, c and d bound past the stale locks")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await port.close()
        return pods_now(fake_api)

    pods = asyncio.run(asyncio.wait_for(go(), 40))
    nodes = {k: pods[f"a/{k}"]["spec"].get("nodeName") for k in "ywcdz"}
    assert nodes == {"y": "node-000", "w": "node-004", "c": "node-003", "d": "node-002", "z": None}


def test_a_leader_that_regains_its_lease_rebuilds_what_its_lost_binds_held(fake_api, tmp_path):
    """The long soak's other stall: a leader loses its lease while a Binding is in flight (cancelled), then
    wins it back with no node or queue news in between. Before, it kept the last term's engine, in which
    the cancelled bind's workload still ran: its GPU stayed booked, the pod was never bound (flapping leaders
    piled these up until "no fit" on every node with a quarter of the GPUs in use). Now each term rebuilds
    from a fresh list, and the pod is bound."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> dict:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=1, gpus=1, tenants=("a",))
        elector = LeaderElector(port, "fairgpu-system", "fairgpu", "r1", 3.0, 0.25, 2.0)
        ctl = Controller(port, load_profile("fairgpu"), leadership=elector)
        tasks = [asyncio.create_task(elector.run()), asyncio.create_task(ctl.run())]
        try:
            await until(elector.leading.is_set, 10, "the lease")
            fake_api.control("delay", seconds=30.0, path_contains="/binding")
            await port.create(PODS, chaos_pod("a", "p", ONE), "a")
            await until(lambda: "a/p" in ctl.inflight, 10, "p's bind under way")
            await asyncio.sleep(0.5)  # its node lock taken and seen: no node news is left for the next term
            fake_api.control("delay", seconds=5.0, path_contains="/leases/")
            await until(lambda: not elector.leading.is_set(), 10, "the step-down")
            fake_api.control("clear-faults")
            await until(elector.leading.is_set, 10, "the lease again")
            await until(lambda: (ctl.pods.cache.get("a/p") or {}).get("spec", {}).get("nodeName"), 10, "p bound")
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await port.close()
        return ctl.pods.cache["a/p"]

    assert asyncio.run(asyncio.wait_for(go(), 60))["spec"]["nodeName"] == "node-000"
