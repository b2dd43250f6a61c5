"""What the nodes would do, for tests over the wire: HAMi's device plugin consumes each allocation (bind-phase
success, to-allocate erased, node lock released) and the kubelet starts the pod (Running and Ready), and
stops a pod marked for deletion once its grace period has passed (then deletes it with grace 0); it also
audits every GPU on every allocation for over-commitment."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from fairgpu.errors import KubeError
from fairgpu.k8s import hami
from fairgpu.k8s.informer import Informer
from fairgpu.k8s.port import NODES, PODS, KubePort

GPU_MEM = 81920
SPLIT = 10


class FakeNodes:
    def __init__(self, port: KubePort) -> None:
        self.port = port
        self.informer = Informer(port, PODS, self._event)
        self.todo: asyncio.Queue[str] = asyncio.Queue()
        self.violations: list[str] = []
        self.started: set[str] = set()
        self.stopping: set[str] = set()
        self._tasks: set[asyncio.Task] = set()

    def _event(self, kind: str, obj: dict) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if kind != "DELETED" and obj["metadata"].get("deletionTimestamp") and key not in self.stopping:
            self.stopping.add(key)
            self._spawn(self._stop(key, obj["metadata"].get("deletionGracePeriodSeconds", 0)))
        ann = obj["metadata"].get("annotations") or {}
        waiting = ann.get(hami.BIND_PHASE) == "allocating" or hami.ALLOCATED not in ann
        if kind != "DELETED" and obj["spec"].get("nodeName") and waiting:
            self.todo.put_nowait(key)

    def audit(self, node: str) -> None:
        cores: dict[str, int] = defaultdict(int)
        mem: dict[str, int] = defaultdict(int)
        tasks: dict[str, int] = defaultdict(int)
        exclusive: set[str] = set()
        for obj in self.informer.cache.values():
            ann = obj["metadata"].get("annotations") or {}
            if obj["spec"].get("nodeName") != node or hami.ALLOCATED not in ann:
                continue
            for seg in hami.decode_devices(ann[hami.ALLOCATED]):
                for d in seg:
                    cores[d.uuid] += d.cores
                    mem[d.uuid] += d.memory_mib
                    tasks[d.uuid] += 1
                    if d.cores >= 100:
                        exclusive.add(d.uuid)
        for uuid in tasks:
            shared_whole = uuid in exclusive and tasks[uuid] > 1
            if cores[uuid] > 100 or mem[uuid] > GPU_MEM or tasks[uuid] > SPLIT or shared_whole:
                self.violations.append(f"{node} {uuid}: cores {cores[uuid]} mem {mem[uuid]} tasks {tasks[uuid]}")

    async def run(self) -> None:
        """Nodes work in parallel; each pod's allocation is its own task, as each node's plugin is its own."""
        inf = asyncio.create_task(self.informer.run())
        try:
            while True:
                key = await self.todo.get()
                if key in self.started:
                    continue
                obj = self.informer.cache.get(key)
                if obj is None:
                    continue
                self.started.add(key)
                self._spawn(self._allocate(key, obj))
        finally:
            inf.cancel()
            for t in list(self._tasks):
                t.cancel()

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _stop(self, key: str, grace: float) -> None:
        """The containers ignore SIGTERM: the pod goes when its grace period is over."""
        await asyncio.sleep(grace)
        ns, name = key.split("/", 1)
        try:
            await self.port.delete(PODS, name, ns, grace_seconds=0)
        except KubeError as err:
            if err.code != 404:
                raise

    async def _allocate(self, key: str, obj: dict) -> None:
        ns, name = key.split("/", 1)
        node = obj["spec"]["nodeName"]
        self.audit(node)
        ann = obj["metadata"].get("annotations") or {}
        try:
            if hami.ALLOCATED in ann:
                erased = ";" * len(hami.decode_devices(ann[hami.TO_ALLOCATE]))
                patch = {"metadata": {"annotations": {hami.TO_ALLOCATE: erased, hami.BIND_PHASE: "success"}}}
                await self.port.patch(PODS, name, patch, ns)
                n = await self.port.get(NODES, node)
                lock = (n["metadata"].get("annotations") or {}).get(hami.NODE_LOCK, "")
                if lock.endswith(f",{ns},{name}"):
                    release = {"metadata": {"resourceVersion": n["metadata"]["resourceVersion"]}}
                    release["metadata"]["annotations"] = {hami.NODE_LOCK: None}
                    await self.port.patch(NODES, node, release)
            running = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            await self.port.patch(PODS, name, {"status": running}, ns, subresource="status")
        except KubeError as err:
            if err.code == 409:  # the node changed under us: try again
                self.started.discard(key)
                self.todo.put_nowait(key)
            elif err.code != 404:
                raise
