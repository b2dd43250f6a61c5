"""The HAMi commit sequence against the fake apiserver: node lock semantics, 409 on an already-made bind,
rollback that releases only its own lock."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from fairgpu.errors import BindError, KubeError
from fairgpu.k8s import hami
from fairgpu.k8s.binder import Binder
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.port import NODES, PODS
from fairgpu.k8s.translate import pod_info
from test_live_scheduling import node, pod

DEV = [hami.DeviceUse("GPU-00-0", "NVIDIA", 81920, 100)]


def run(fake_api, tmp_path, body):
    async def go():
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        for i in range(2):
            await port.create(NODES, node(i))
        try:
            await body(port)
        finally:
            await port.close()

    asyncio.run(asyncio.wait_for(go(), 30))


async def make(port, name: str) -> object:
    return pod_info(await port.create(PODS, pod("a", name, {"nvidia.com/gpu": "1"}), "a"))


def lock_of(obj: dict) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get(hami.NODE_LOCK)


def test_commit_writes_hami_keys_in_order_and_binds_with_uid(fake_api, tmp_path):
    async def body(port):
        p = await make(port, "p")
        await Binder(port).bind(p, "node-00", DEV)
        got = await port.get(PODS, "p", "a")
        ann = got["metadata"]["annotations"]
        assert got["spec"]["nodeName"] == "node-00"
        assert ann[hami.ALLOCATED] == ann[hami.TO_ALLOCATE] == "GPU-00-0,NVIDIA,81920,100:;;"
        assert ann[hami.BIND_PHASE] == "allocating" and ann[hami.VGPU_NODE] == "node-00"
        assert lock_of(await port.get(NODES, "node-00")).endswith(",a,p")  # the device plugin releases it

    run(fake_api, tmp_path, body)


def test_already_bound_to_the_same_node_is_success_elsewhere_rolls_back_own_lock(fake_api, tmp_path):
    async def body(port):
        p = await make(port, "p")
        await port.bind("a", "p", p.uid, "node-00", {})
        await Binder(port).bind(p, "node-00", DEV)  # 409 "already assigned to node-00": it is where we want it
        q = await make(port, "q")
        await port.bind("a", "q", q.uid, "node-00", {})
        with pytest.raises(BindError, match="already assigned"):
            await Binder(port).bind(q, "node-01", [hami.DeviceUse("GPU-01-0", "NVIDIA", 81920, 100)])
        assert lock_of(await port.get(NODES, "node-01")) is None  # our lock on node-01 was released

    run(fake_api, tmp_path, body)


def test_waits_for_a_live_lock_and_never_removes_anothers(fake_api, tmp_path):
    async def body(port):
        holder = await make(port, "holder")
        binder = Binder(port)
        await binder.bind(holder, "node-00", DEV)  # holder is bound, allocating: its lock is live
        nxt = await make(port, "next")
        task = asyncio.create_task(binder.bind(nxt, "node-00", [hami.DeviceUse("GPU-00-1", "NVIDIA", 81920, 100)]))
        await asyncio.sleep(0.5)
        assert not task.done() and lock_of(await port.get(NODES, "node-00")).endswith(",a,holder")
        await port.patch(PODS, "holder", {"metadata": {"annotations": {hami.BIND_PHASE: "success"}}}, "a")
        await asyncio.sleep(0.3)  # HAMi: its bind-phase does not free the lock; the device plugin releases it
        assert not task.done()
        await port.patch(NODES, "node-00", {"metadata": {"annotations": {hami.NODE_LOCK: None}}})
        await asyncio.wait_for(task, 10)
        assert (await port.get(PODS, "next", "a"))["spec"]["nodeName"] == "node-00"
        # a failed bind whose lock was meanwhile replaced (say, taken over after expiry) leaves it alone
        stolen = hami.NodeLock(binder.clock(), "a", "other").encode()

        class Stealing:
            def __getattr__(self, name):
                return getattr(port, name)

            async def bind(self, ns, name, uid, target, annotations):
                await port.patch(NODES, target, {"metadata": {"annotations": {hami.NODE_LOCK: stolen}}})
                raise KubeError(500, "InternalError", "the apiserver fell over")

        late = await make(port, "late")
        with pytest.raises(BindError, match="fell over"):
            # settle 0: the 500 is final at once, as past the window in which a Binding is sent again
            await Binder(Stealing(), settle=0.0).bind(late, "node-01", [hami.DeviceUse("GPU-01-0", "NVIDIA", 1000, 10)])
        assert lock_of(await port.get(NODES, "node-01")) == stolen

    run(fake_api, tmp_path, body)


def test_binds_to_one_node_take_turns_two_at_a_time(fake_api, tmp_path):
    """Binds to one node wait for its lock in turn: past the start, only the holder and the next one (which
    annotates its pod meanwhile) do any work, so a long queue for one node does not flood the API server."""
    fake_api.control("device-plugin")  # each Binding's allocation is consumed and its lock released

    async def body(port):
        started, most = 0, 0

        class Counting:
            def __getattr__(self, name):
                return getattr(port, name)

            async def patch(self, kind, name, patch, namespace=None, subresource=None):
                nonlocal started, most
                if kind is PODS:  # a bind's first request: annotating its pod
                    started += 1
                    most = max(most, started)
                return await port.patch(kind, name, patch, namespace, subresource)

            async def bind(self, *args):  # its last: the Binding
                nonlocal started
                try:
                    return await port.bind(*args)
                finally:
                    started -= 1

        pods = [await make(port, f"p{i}") for i in range(6)]
        binder = Binder(Counting())
        devices = [[hami.DeviceUse(f"GPU-00-{i}", "NVIDIA", 81920, 100)] for i in range(6)]
        await asyncio.gather(*(binder.bind(p, "node-00", d) for p, d in zip(pods, devices, strict=True)))
        assert most == 2, most
        for i in range(6):
            assert (await port.get(PODS, f"p{i}", "a"))["spec"]["nodeName"] == "node-00"

    run(fake_api, tmp_path, body)


def _locked(port, value: str):
    return port.patch(NODES, "node-00", {"metadata": {"annotations": {hami.NODE_LOCK: value}}})


def test_node_lock_is_taken_over_only_as_hami_does(fake_api, tmp_path):
    """HAMi's LockNode (pkg/util/nodelock/nodelock.go): a lock is free only when expired (5 min default, or
    the configured expiry), when its owner pod is gone, or when it names the same pod. An owner that exists
    but is not bound yet (its Binding in flight, issue 11 finding 7) keeps it however long; a legacy
    timestamp-only lock names no owner, so only expiry frees it; an unparsable lock is an error."""

    async def body(port):
        await make(port, "owner")  # exists, unbound: its Binding is in flight
        base = Binder(port).clock()
        binder = Binder(port, lock_wait=0.6)

        async def attempt(name: str) -> str:
            p = await make(port, name)
            try:
                await binder.bind(p, "node-00", [hami.DeviceUse("GPU-00-0", "NVIDIA", 1000, 10)])
                return "taken"
            except BindError as err:
                return str(err)

        await _locked(port, hami.NodeLock(base - timedelta(seconds=30), "a", "owner").encode())
        assert "stayed locked" in await attempt("p1")  # the old code took it after 3 s
        await _locked(port, (base - timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%SZ"))
        assert "stayed locked" in await attempt("p2")  # the old code called a legacy lock free
        await _locked(port, "garbage")
        assert "unreadable" in await attempt("p3")  # the old code called it free
        await _locked(port, hami.NodeLock(base - timedelta(minutes=6), "a", "owner").encode())
        assert await attempt("p4") == "taken"  # expired
        await _locked(port, hami.NodeLock(base - timedelta(seconds=5), "a", "gone").encode())
        assert await attempt("p5") == "taken"  # its owner pod does not exist
        await _locked(port, hami.NodeLock(base - timedelta(seconds=30), "a", "owner").encode())
        short = Binder(port, lock_wait=0.6, lock_expiry=timedelta(seconds=20))  # the configured expiry counts
        p6 = await make(port, "p6")
        await short.bind(p6, "node-00", [hami.DeviceUse("GPU-00-0", "NVIDIA", 1000, 10)])

    run(fake_api, tmp_path, body)


def test_a_lock_naming_the_same_pod_is_already_ours(fake_api, tmp_path):
    async def body(port):
        p = await make(port, "again")
        mine = hami.NodeLock(Binder(port).clock() - timedelta(seconds=10), "a", "again").encode()
        await _locked(port, mine)
        await Binder(port, lock_wait=0.5).bind(p, "node-00", DEV)
        assert lock_of(await port.get(NODES, "node-00")) == mine  # held, not rewritten (LockNode returns nil)

    run(fake_api, tmp_path, body)


@pytest.mark.parametrize("open_for", [0, 1, 2])
def test_each_write_of_a_bind_passes_the_fence_and_none_after_it_closes(fake_api, tmp_path, open_for):
    """The fence lets `open_for` writes through, then closes (the lease ends mid-bind): the pod's annotations,
    the node lock and the Binding each stop there (the fake's log: only our own lock is removed after),
    FenceClosed is raised, and nothing is left counted as on the wire (k8s/writes.py). Before, only the
    Binding was fenced."""
    from fairgpu.errors import FenceClosed
    from fairgpu.k8s.writes import Writes

    async def body(port):
        passed: list[int] = []

        def fence() -> None:
            if len(passed) == open_for:
                raise FenceClosed("closed")
            passed.append(1)

        p = await make(port, "p")
        writes = Writes()
        with pytest.raises(FenceClosed):
            await Binder(port, fence=fence, writes=writes).bind(p, "node-00", DEV)
        got, lock = await port.get(PODS, "p", "a"), lock_of(await port.get(NODES, "node-00"))
        annotated = hami.ALLOCATED in (got["metadata"].get("annotations") or {})
        assert (annotated, lock is not None, got["spec"].get("nodeName")) == (open_for >= 1, False, None)
        assert writes.sending == 0 and writes.quiet(60.0)

    run(fake_api, tmp_path, body)
    pod_, node_ = ("PATCH", "/api/v1/namespaces/a/pods/p"), ("PATCH", "/api/v1/nodes/node-00")
    sent = [
        (r["verb"], r["path"])
        for r in fake_api.control("requests")["requests"]
        if r["verb"] != "GET" and r["path"].startswith((pod_[1], node_[1]))
    ]
    assert sent == [[], [pod_], [pod_, node_, node_]][open_for]  # annotations; lock, Binding fenced, our unlock
