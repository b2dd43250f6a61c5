"""Carry out one placement the way HAMi's own scheduler does (design/hami-interop.md §3.3 and §5): pod
annotations, node lock, then the Binding with the pod's UID as precondition, carrying bind-phase. Each of
the three writes passes the leader fence and counts as on the wire (writes.py).

On failure the lock is released only if it is still ours, and BindError tells the controller to roll back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from fairgpu.errors import BindError, KubeError
from fairgpu.k8s import hami
from fairgpu.k8s.port import NODES, PODS, KubePort
from fairgpu.k8s.translate import PodInfo
from fairgpu.k8s.writes import Writes, may_have_landed
from fairgpu.model.node import GpuDevice, mig_candidates
from fairgpu.state import Placement

BINDING_SETTLE = 60.0  # the API server's default --request-timeout


def device_string(pod: PodInfo, devices: list[hami.DeviceUse], segments: tuple[int, ...] = ()) -> str:
    """Each container's segment, init containers first (`EncodePodSingleDevice`): the GPU containers list
    their cards, `segments` of `devices` each in turn (all of them for the first when empty), the others
    none."""
    sizes = segments or (len(devices),)
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    own = {c: devices[a : a + n] for c, a, n in zip(pod.gpu_containers, starts, sizes, strict=False)}
    return hami.encode_devices([own.get(i, []) for i in range(pod.containers)])


def mig_string(pod: PodInfo, placement: Placement, gpus: tuple[GpuDevice, ...]) -> str:
    """`hami.io/vgpu-mig-allocations` for the placement's entries on MIG cards, as HAMi's PatchAnnotations writes
    it (`EncodeMigAllocations`): container index (init containers first), device index within the container,
    the card, the MIG profile and its slices. "" when no entry is on a MIG card."""
    out = []
    for k, entries in enumerate(placement.containers()):
        for di, e in enumerate(entries):
            c = placement.mig[e] if placement.mig else -1
            if c >= 0:
                dev = gpus[placement.slots[e]]
                profile, start, size = mig_candidates(dev.mig)[c]
                out.append(hami.MigAllocation(pod.gpu_containers[k], di, dev.uuid, dev.mig[profile].name, start, size))
    return hami.encode_mig_allocations(out) if out else ""


class Binder:
    def __init__(
        self,
        port: KubePort,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        lock_wait: float = 60.0,
        node_changed: Callable[[str], asyncio.Event] | None = None,
        node_cache: Callable[[str], dict | None] | None = None,
        pod_cache: Callable[[str], dict | None] | None = None,
        lock_expiry: timedelta = hami.LOCK_EXPIRY,
        settle: float = BINDING_SETTLE,
        fence: Callable[[], None] = lambda: None,
        abandoned: Callable[[dict, str], bool] | None = None,
        writes: Writes | None = None,
    ) -> None:
        self.port = port
        self.lock_expiry = lock_expiry  # HAMi's nodeLockExpire (HAMI_NODELOCK_EXPIRE)
        self.clock = clock
        self.lock_wait = lock_wait
        self.settle = settle  # seconds a Binding whose failure may still land is sent again (see _binding)
        # An event set at the node's next change (informer): waiting for a lock then costs no polling. It is
        # taken before each read of the node, so a release landing between the read and the wait is not missed.
        self.node_changed = node_changed
        # The informers' copies of nodes and pods save a GET per lock and per look at a lock's owner; a stale
        # node costs one 409, after which the node is read again once its informer has caught up.
        self.node_cache = node_cache
        self.pod_cache = pod_cache
        # Raises FenceClosed unless this replica still leads with margin: checked right before each write.
        self.fence = fence
        self.writes = writes or Writes()  # what is on the wire (writes.py)
        # (owner pod, node) → True for an unbound pod of this scheduler that this replica, leading, is not
        # binding to that node: a lock it owns there was left by a leader that died or stepped down mid-bind
        # (its cancelled task never got to unlock), or by an earlier attempt of ours that placed it elsewhere
        # since; fencing keeps a deposed leader from sending the Binding now. Without it such a lock held
        # the node for HAMi's whole lock expiry (5 min): leaders flapping under load left most nodes locked.
        self.abandoned = abandoned
        self._local: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)  # one contender per node
        # Binds to one node take their turns at its lock anyway; at most one more than the lock's holder
        # starts its work (annotating its pod meanwhile), so a binpacked node's long queue of pods does not
        # flood the API server ahead of the binds that could proceed on other nodes.
        self._turns: defaultdict[str, asyncio.Semaphore] = defaultdict(lambda: asyncio.Semaphore(2))

    async def bind(
        self, pod: PodInfo, node: str, devices: list[hami.DeviceUse], segments: tuple[int, ...] = (), mig: str = ""
    ) -> None:
        """Bind `pod` to `node` with these cards, `segments` of them per GPU container (see device_string), and
        these MIG reservations (mig_string; "" for none)."""
        if not devices:  # no GPU: nothing for HAMi to enforce
            await self._binding(pod, node, {})
            return
        async with self._turns[node]:
            await self._bind_gpus(pod, node, device_string(pod, devices, segments), mig)

    async def _bind_gpus(self, pod: PodInfo, node: str, alloc: str, mig: str) -> None:
        now = self.clock()
        unix = str(int(now.timestamp()))
        await self._patch_pod(
            pod,
            {
                "labels": {hami.VGPU_NODE: hami.label_value(node)},
                "annotations": {
                    hami.VGPU_NODE: node,
                    hami.VGPU_TIME: unix,
                    hami.TO_ALLOCATE: alloc,
                    hami.ALLOCATED: alloc,
                    hami.MIG_ALLOCATIONS: mig or None,  # None: no stale reservation of an earlier attempt stays
                },
            },
        )
        async with self._local[node]:
            lock = await self._lock(pod, node)
        try:
            # HAMi patches bind-phase and bind-time just before the Binding. Here they ride on the Binding:
            # the apiserver merges its annotations into the pod in the very write that sets spec.nodeName, so
            # the kubelet (and HAMi's device plugin after it) never sees the pod bound without them, and a
            # failed Binding leaves no "allocating" pod behind. One round trip fewer per bind.
            await self._binding(pod, node, {hami.BIND_PHASE: "allocating", hami.BIND_TIME: unix})
        except BindError:
            await self._unlock(node, lock)
            raise

    async def _patch_pod(self, pod: PodInfo, meta: dict) -> None:
        """Annotate the pod on condition that it is the version this decision was made from (its
        resourceVersion), so a record written meanwhile by another scheduler is never overwritten. A stale
        copy costs one GET: the write goes ahead if the pod is still unbound and the same pod (UID)."""
        cached = self.pod_cache(pod.key) if self.pod_cache is not None else None
        rv = (cached or {}).get("metadata", {}).get("resourceVersion")
        for _ in range(2):
            try:
                body = {"metadata": {**meta, "uid": pod.uid, **({"resourceVersion": rv} if rv else {})}}
                await self.writes.send(self.fence, self.port.patch, PODS, pod.name, body, pod.namespace)
                return
            except KubeError as err:
                if err.code != 409 or rv is None:
                    raise BindError(f"annotating pod: {err}") from err
                last = err
            try:
                fresh = await self.port.get(PODS, pod.name, pod.namespace)
            except KubeError as err:
                raise BindError(f"annotating pod: {err}") from err
            if fresh["metadata"].get("uid") != pod.uid or (fresh.get("spec") or {}).get("nodeName"):
                break
            rv = fresh["metadata"]["resourceVersion"]
        raise BindError(f"annotating pod: {last}")

    async def _binding(self, pod: PodInfo, node: str, annotations: dict[str, str]) -> None:
        """Send the Binding until an answer settles it. A failure that may still land (no answer, a 5xx: the API
        server answers its timeout while the write goes on) is not taken for a refusal: read back unbound, the
        pod's room was freed and given to another pod while the first Binding still landed. The same Binding is
        sent again (fenced, counted) until it is answered 201 or refused for good, or 409 "already assigned" to
        this node tells an earlier one landed; after `settle` seconds (the API server's request timeout, past
        which no attempt is still carried out) a failure is final."""
        loop = asyncio.get_running_loop()
        end, pause = loop.time() + self.settle, 0.1
        while True:
            try:
                await self.writes.send(self.fence, self.port.bind, pod.namespace, pod.name, pod.uid, node, annotations)
                return
            except KubeError as err:
                # A retried request whose first attempt landed: the pod already sits where we put it.
                if err.code == 409 and f'already assigned to node "{node}"' in err.message:
                    return
                if not may_have_landed(err) or loop.time() + pause > end:
                    raise BindError(f"binding: {err}") from err
            await asyncio.sleep(pause)
            pause = min(2.0, pause * 2)

    async def _lock(self, pod: PodInfo, node: str) -> str:
        """Take HAMi's node lock with optimistic concurrency; wait while another pod legitimately holds it.
        The node is read from the informer's cache as long as news of it keeps coming; after a wait that
        brought none (a quiet or broken watch), from the server."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.lock_wait
        pause = 0.02
        news = True
        while True:
            changed = self.node_changed(node) if self.node_changed is not None else None
            obj = self.node_cache(node) if news and self.node_cache is not None else None
            try:
                if obj is None:
                    obj = await self.port.get(NODES, node)
                held = (obj["metadata"].get("annotations") or {}).get(hami.NODE_LOCK)
                state = "free" if held is None else await self._ours_or_free(held, pod, node)
                if held is not None and state == "ours":
                    return held
                if state == "free":
                    value = hami.NodeLock(self.clock(), pod.namespace, pod.name).encode()
                    patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}}
                    patch["metadata"]["annotations"] = {hami.NODE_LOCK: value}
                    await self.writes.send(self.fence, self.port.patch, NODES, node, patch)
                    return value
            except KubeError as err:
                if err.code != 409:  # 409: the node changed since that copy; its news is on the way
                    raise BindError(f"locking node {node}: {err}") from err
            if loop.time() > deadline:
                raise BindError(f"node {node} stayed locked by another pod for {self.lock_wait:g}s")
            news = False
            if changed is None:
                await asyncio.sleep(pause)
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):  # not wait_for: it can lose a cancellation (3.11)
                        await changed.wait()
                    news = True
            pause = min(1.0, pause * 2)

    async def _ours_or_free(self, value: str, pod: PodInfo, node: str) -> str:
        """HAMi's `LockNode`: a lock is taken over when it has expired or its owner pod no longer exists; a lock
        naming this very pod is already ours. Beyond HAMi, a lock is stale (free) when its owner is bound to
        another node (this node's device plugin, which releases it, will never see that pod) or is one of ours
        abandoned mid-bind (see `abandoned`). Anything else holds, however long its owner has been waiting for
        its Binding. A lock that does not parse is an error (HAMi refuses it too), not free."""
        try:
            lock = hami.decode_lock(value)
        except hami.FormatError as err:
            raise BindError(f"node lock unreadable, not taking it: {err}") from err
        if lock.expired(self.clock(), self.lock_expiry):
            return "free"
        if (lock.namespace, lock.pod) == (pod.namespace, pod.name):
            return "ours"
        if not lock.namespace or not lock.pod:
            return "held"  # a legacy timestamp-only lock names no owner: only its expiry frees it
        owner = self.pod_cache(f"{lock.namespace}/{lock.pod}") if self.pod_cache is not None else None
        # The cache may be behind: a cached owner is trusted when bound (binds are final), and an unbound one
        # that looks abandoned is read again from the server, which knows whether a Binding landed meanwhile.
        unbound = owner is not None and not (owner.get("spec") or {}).get("nodeName")
        if owner is None or (unbound and self.abandoned is not None and self.abandoned(owner, node)):
            try:
                owner = await self.port.get(PODS, lock.pod, lock.namespace)
            except KubeError as err:
                if err.code == 404:
                    return "free"
                raise
        where = (owner.get("spec") or {}).get("nodeName")
        if where and where != node:
            return "free"
        if not where and self.abandoned is not None and self.abandoned(owner, node):
            return "free"
        return "held"

    async def _unlock(self, node: str, value: str) -> None:
        """Remove the lock only while it is still the one we wrote (not fenced: it touches nothing another
        replica wrote, and a lock left behind holds the node until it is found abandoned)."""
        for _ in range(5):
            try:
                obj = await self.port.get(NODES, node)
                if (obj["metadata"].get("annotations") or {}).get(hami.NODE_LOCK) != value:
                    return
                patch = {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]}}
                patch["metadata"]["annotations"] = {hami.NODE_LOCK: None}
                await self.port.patch(NODES, node, patch)
                return
            except KubeError as err:
                if err.code != 409:
                    return  # the lock expires on its own; nothing more to do safely
