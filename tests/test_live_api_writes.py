"""Issue 11, controller side: what the controller writes is valid and aimed right: the vGPU node label stays a
valid label value, an eviction names its pod's UID, Events are aggregated and rate-limited like client-go's."""

from __future__ import annotations

import asyncio

import pytest

from chaos import chaos_node, chaos_pod
from fairgpu.catalog import load_profile
from fairgpu.errors import KubeError
from fairgpu.k8s import hami
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.events import AGGREGATE_MAX, COMBINED, SPAM_BURST, EventRecorder
from fairgpu.k8s.port import NODES, PODS
from fairgpu.k8s.reporter import Reporter
from live_setup import ONE, pods_now, setup
from test_live_scheduling import stop, until


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
            await stop(port, run)

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


def test_a_pending_pods_reason_survives_failed_condition_writes(fake_api, tmp_path):
    """A loaded soak ended with a pending pod that carried no reason: its one PodScheduled=False write met an
    injected 409 (which the client, unlike a 5xx, does not retry), and as its reason did not change, the
    reporter (which posts a message once) never wrote it again. Now a failed write is tried again while it is
    still the pod's latest reason: two refused writes, and the third lands, with no second explanation."""
    fake_api.control("device-plugin")

    async def go() -> dict:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        await port.create(PODS, chaos_pod("a", "fits", ONE), "a")
        await port.create(PODS, chaos_pod("a", "big", {"nvidia.com/gpu": "8"}), "a")  # 8 of 2×4 vGPUs: never
        fake_api.control("fault", code=409, count=2, verb="PATCH", path_contains="/pods/big/status")
        ctl = Controller(port, load_profile("fairgpu"))
        ctl.reporter.explain_every = 60.0  # no second explanation within the test: the retry alone must land it
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1, 10, "the pod that fits")
            await until(lambda: _reason(pods_now(fake_api)["a/big"]), 10, "big's reason")
        finally:
            await stop(port, run)
        return pods_now(fake_api)["a/big"]

    big = asyncio.run(asyncio.wait_for(go(), 40))
    assert fake_api.control("state")["injected"].get("before 409") == 2  # both faults hit big's writes
    assert _reason(big) == "workload a/big: nvidia.com/gpu 8 is more than any node has", _reason(big)


def _reason(pod: dict) -> str:
    conds = (pod.get("status") or {}).get("conditions") or []
    return next((c.get("message", "") for c in conds if c.get("type") == "PodScheduled" and c["status"] == "False"), "")


def test_every_waiting_pod_is_told_its_place_before_its_full_explanation(fake_api, tmp_path, monkeypatch):
    """Full explanations are rationed (each replays the queue ahead): a starved soak ended with pods that had
    waited through the whole settling time without a first one, so with no reason at all. Now a pod never
    told anything gets its queue and place at the first pass that leaves it waiting. Here no full
    explanation is ever due, and each of the five pods that do not fit still says where it stands."""
    monkeypatch.setattr(Reporter, "wants_explanation", lambda self, key, now: False)
    whole2 = {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"}  # two whole cards: one pod fills the node

    async def go() -> dict[str, dict]:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await setup(port, nodes=1, gpus=2)
        for i in range(6):
            await port.create(PODS, chaos_pod("a", f"p{i}", whole2), "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds == 1, 10, "the pod that fits")
            await until(lambda: sum(bool(_reason(p)) for p in pods_now(fake_api).values()) == 5, 10, "5 reasons")
        finally:
            await stop(port, run)
        return pods_now(fake_api)

    pods = asyncio.run(asyncio.wait_for(go(), 40))
    waiting = {k: _reason(p) for k, p in pods.items() if not p["spec"].get("nodeName")}
    assert len(waiting) == 5, waiting
    places = sorted(int(m.split(", ")[1].split(" of ")[0]) for m in waiting.values())
    assert places == [1, 2, 3, 4, 5], waiting
    assert all(f"workload {k} (queue q-a): pending, " in m and " of 5 in its queue" in m for k, m in waiting.items())
