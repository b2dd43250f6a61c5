"""What the nodes would do, for tests over the wire: HAMi's device plugin serves each bound GPU pod the way
its Allocate does (`hami_allocate`, below), the kubelet starts the pod (Running and Ready), and stops a pod
marked for deletion once its grace period has passed (then deletes it with grace 0); it also audits every
GPU on every allocation for over-commitment. With `complete`, a pod's containers exit (Succeeded) once it has
run for its `fairgpu.io/expected-runtime`, on the given clock, waiting with the clock's `sleep_until` (a
logical clock, tests/logical_clock.py, runs a simulated hour in seconds). `runs` keeps when each pod ran, on
that clock.

Every refusal of the device plugin double, and every limit it would set that differs from what HAMi's own
scheduler would have written for the pod, is a violation: the integration tests assert there are none."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from fairgpu import resources as r
from fairgpu.errors import FormatError, KubeError, RequestError
from fairgpu.k8s import hami
from fairgpu.k8s.informer import Informer
from fairgpu.k8s.port import NODES, PODS, KubePort
from fairgpu.k8s.translate import EXPECTED_RUNTIME
from fairgpu.model import gpu_request
from fairgpu.spec import parse_duration

GPU_MEM = 81920
SPLIT = 10


class AllocateError(Exception):
    """HAMi's device plugin fails the pod (bind-phase failed; the kubelet reports UnexpectedAdmissionError)."""


@dataclass(slots=True)
class Allocation:
    """What HAMi's Allocate answers the kubelet for one container, and what the rest of the path writes."""

    served: str  # namespace/name of the pod whose annotation was consumed
    envs: list[dict[str, str]] = field(default_factory=list)  # per GPU container, in kubelet's order
    erased: str = ""  # hami.io/vgpu-devices-to-allocate written back
    success: bool = False  # no NVIDIA entry left: bind-phase success and the lock released


def _containers(pod: dict) -> list[dict]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _limits(c: dict) -> dict:
    return (c.get("resources") or {}).get("limits") or {}


def hami_allocate(
    pod: dict, node: dict, get_pod: Callable[[str, str], dict | None], node_pods: list[dict]
) -> Allocation:
    """HAMi v2.10.0's NVIDIA Allocate path (pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go
    `Allocate`, util.go `popNextContainerDevices`, `podAllocationTrySuccess`; pkg/util/util.go
    `GetPendingPod`) for the kubelet admitting `pod` on `node`, non-MIG mode:

    1. the pod served is the one the node lock names (an unparsable lock or a missing pod is an error);
       without a lock, the first Pending pod on the node with bind-time, bind-phase allocating or success
       and vgpu-node naming the node;
    2. its `vgpu-devices-to-allocate` is decoded (missing: "device request not found");
    3. for each container the kubelet allocates for (those with an nvidia.com/gpu limit, init containers
       first) the next non-empty segment is popped; its device count must equal the container's GPU count
       ("device number not matched");
    4. envs: NVIDIA_VISIBLE_DEVICES, CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m, CUDA_DEVICE_SM_LIMIT from the first
       device;
    5. the erased string is written back; when no NVIDIA entry remains the pod is a success.

    Raises AllocateError where HAMi fails the pod. Serving a pod other than the one being admitted is what
    HAMi would do (and the containers would get another pod's limits): the caller treats it as a failure.
    """
    annotations = node["metadata"].get("annotations") or {}
    lock = annotations.get(hami.NODE_LOCK)
    name = node["metadata"]["name"]
    if lock is not None:
        try:
            held = hami.decode_lock(lock)
        except FormatError as err:
            raise AllocateError(str(err)) from err
        current = get_pod(held.namespace, held.pod)
        if current is None:
            raise AllocateError(f"pods {held.pod!r} not found (named by the node lock)")
    else:
        current = None
        for p in node_pods:  # HAMi lists the pods on the node and serves the first that matches
            ann = p["metadata"].get("annotations") or {}
            if (
                (p.get("status") or {}).get("phase", "Pending") == "Pending"
                and hami.BIND_TIME in ann
                and ann.get(hami.BIND_PHASE) in ("allocating", "success")
                and ann.get(hami.VGPU_NODE) == name
            ):
                current = p
                break
        if current is None:
            raise AllocateError(f"no binding pod found on node {name}")
    served = f"{current['metadata']['namespace']}/{current['metadata']['name']}"
    raw = (current["metadata"].get("annotations") or {}).get(hami.TO_ALLOCATE)
    if raw is None:
        raise AllocateError("device request not found")
    try:
        segments = hami.decode_devices(raw)
    except FormatError as err:
        raise AllocateError(str(err)) from err
    out = Allocation(served)
    init = len((current.get("spec") or {}).get("initContainers") or [])
    register = annotations.get(hami.NODE_REGISTER)
    mig_cards = {d.uuid: d.mig_profiles for d in hami.decode_register(register) if d.mode == "mig"} if register else {}
    active = _active_mig(node_pods, current)
    for c in _containers(pod):
        if r.GPU not in _limits(c):
            continue  # the kubelet calls the device plugin only for its resource
        want = r.count(_limits(c)[r.GPU])
        if want == 0:
            continue
        nxt = next((i for i, seg in enumerate(segments) if seg), None)
        if nxt is None:
            raise AllocateError("no pending device allocation found")
        if nxt >= len(_containers(current)):
            raise AllocateError(f"container index {nxt} out of range (init={init})")
        devices, segments[nxt] = segments[nxt], []
        if len(devices) != want:
            raise AllocateError("device number not matched")
        if any(mig_cards.get(d.uuid) for d in devices):  # the node's plugin runs in operating mode "mig"
            out.envs.append(
                {"NVIDIA_VISIBLE_DEVICES": ",".join(_mig_devices(current, nxt, devices, mig_cards, active))}
            )
            continue
        envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(d.uuid for d in devices)}
        envs |= {f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{d.memory_mib}m" for i, d in enumerate(devices)}
        envs["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].cores)
        out.envs.append(envs)
    out.erased = hami.encode_devices(segments)
    out.success = hami.VENDOR not in out.erased
    return out


def _mig_uuid(gpu: str, start: int, size: int) -> str:
    return f"MIG-{gpu}-{start}-{size}"


def _active_mig(node_pods: list[dict], current: dict) -> dict[str, list[tuple[int, int]]]:
    """Slices (start, size) per card of the MIG instances other pods on the node hold."""
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p in node_pods:
        if p["metadata"].get("uid") == current["metadata"].get("uid"):
            continue
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        try:
            listed = hami.decode_mig_allocations((p["metadata"].get("annotations") or {}).get(hami.MIG_ALLOCATIONS, ""))
        except FormatError:
            continue  # HAMi's scheduler skips an unreadable reservation list too
        out.update({a.gpu: [*out[a.gpu], (a.start, a.size)] for a in listed})
    return out


def _mig_devices(
    pod: dict, container: int, devices: list[hami.DeviceUse], cards: dict, active: dict[str, list[tuple[int, int]]]
) -> list[str]:
    """GetContainerDeviceStrArray in mode "mig": the container's reservations (by container index, in device
    order) must be as many as its devices, each on the device's card, a profile and placement the card
    registered, on slices no other pod's instance holds (EnsureAllocation); answers the MIG devices."""
    try:
        raw = (pod["metadata"].get("annotations") or {}).get(hami.MIG_ALLOCATIONS, "")
        mine = [a for a in hami.decode_mig_allocations(raw) if a.container == container]
    except FormatError as err:
        raise AllocateError(f"decode scheduler MIG allocations: {err}") from err
    mine.sort(key=lambda a: a.device)
    if len(mine) != len(devices):
        raise AllocateError(f"container has {len(mine)} MIG reservations, requested {len(devices)} devices")
    out = []
    for a, d in zip(mine, devices, strict=True):
        if a.gpu != d.uuid:
            raise AllocateError(f"MIG reservation GPU {a.gpu} does not match allocated GPU {d.uuid}")
        if not any(p.name == a.profile and (a.start, a.size) in p.placements for p in cards.get(d.uuid, ())):
            raise AllocateError(f"{d.uuid} offers no MIG profile {a.profile} at {a.start}+{a.size}")
        if any(a.start < s + z and s < a.start + a.size for s, z in active[d.uuid]):
            raise AllocateError(f"MIG instance {a.profile} at {a.start}+{a.size} on {d.uuid} overlaps another")
        active[d.uuid].append((a.start, a.size))
        out.append(_mig_uuid(d.uuid, a.start, a.size))
    return out


def _hami_mig_choice(profiles, occupied: list[tuple[int, int]], need: int) -> tuple[int, int] | None:
    """selectMigCandidate, written from HAMi's Go (not fairgpu's arrays): profiles by memory then slice count,
    the first with `need` MiB and a placement (1g./3g. highest start first) on free slices."""
    for p in sorted(profiles, key=lambda p: (p.memory_mib, p.slices)):
        if p.memory_mib < need:
            continue
        high = p.name.startswith(("1g.", "3g."))
        for start, size in sorted(p.placements, key=lambda x: -x[0] if high else x[0]):
            if not any(start < s + z and s < start + size for s, z in occupied):
                return start, size
    return None


def scheduler_limits(pod: dict, node: dict, node_pods: list[dict] = ()) -> list[dict[str, str]]:
    """The envs HAMi's device plugin would set had HAMi's own scheduler placed `pod` on the cards the pod's
    record names: per GPU container, memory from its request under HAMi's rules (gpumem, else the
    percentage of that card's registered memory) and cores clamped to 100. Independent of fairgpu's
    placement arithmetic: only the card choice is taken from the record."""
    register = (node["metadata"].get("annotations") or {}).get(hami.NODE_REGISTER)
    devmem = {d.uuid: d.memory_mib for d in hami.decode_register(register)} if register else {}
    mig_cards = {d.uuid: d.mig_profiles for d in hami.decode_register(register) if d.mode == "mig"} if register else {}
    occupied = _active_mig(list(node_pods), pod)
    segments = hami.decode_devices((pod["metadata"].get("annotations") or {}).get(hami.ALLOCATED, ""))
    out = []
    for i, c in enumerate(_containers(pod)):
        res = {**((c.get("resources") or {}).get("requests") or {}), **_limits(c)}
        try:
            g = gpu_request(res)
        except RequestError:
            g = None
        if g is None or r.GPU not in _limits(c):
            continue
        cards = [d.uuid for d in segments[i]] if i < len(segments) else []
        if any(u in mig_cards for u in cards):  # what HAMi's Fit and AddResourceUsage would have reserved
            chosen = []
            for u in cards:
                pick = _hami_mig_choice(mig_cards[u], occupied[u], g.mem_for(devmem.get(u, 0)))
                chosen.append(_mig_uuid(u, *pick) if pick else "none")
                if pick:
                    occupied[u].append(pick)
            out.append({"NVIDIA_VISIBLE_DEVICES": ",".join(chosen)})
            continue
        envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(cards)}
        envs |= {f"CUDA_DEVICE_MEMORY_LIMIT_{j}": f"{g.mem_for(devmem.get(u, 0))}m" for j, u in enumerate(cards)}
        envs["CUDA_DEVICE_SM_LIMIT"] = str(g.cores)
        out.append(envs)
    return out


class FakeNodes:
    def __init__(
        self,
        port: KubePort,
        clock: Callable[[], float] = time.time,
        complete: bool = False,
        sleep_until: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.port = port
        self.clock, self.complete = clock, complete
        self.sleep_until = sleep_until or (lambda t: asyncio.sleep(max(0.0, t - self.clock())))
        self.runs: dict[str, list[list[float]]] = defaultdict(list)  # pod key → [started, ended] on the clock
        self.informer = Informer(port, PODS, self._event)
        self.todo: asyncio.Queue[str] = asyncio.Queue()
        self.violations: list[str] = []
        self.allocations: dict[str, Allocation] = {}  # pod key → what HAMi's device plugin answered
        self.started: set[str] = set()
        self.stopping: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self.busy = 0  # pods being started, finished or stopped now (their API calls under way)

    def idle(self) -> bool:
        """Nothing to start and no API call under way (pods running towards their exit do not count)."""
        return self.todo.empty() and not self.busy

    def _event(self, kind: str, obj: dict) -> None:
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        if kind == "DELETED":
            self._ended(key)
            self.started.discard(key)  # a new pod of that name starts afresh
            self.stopping.discard(key)
        if kind != "DELETED" and obj["metadata"].get("deletionTimestamp") and key not in self.stopping:
            self.stopping.add(key)
            self._spawn(self._stop(key, obj["metadata"].get("deletionGracePeriodSeconds", 0)))
        ann = obj["metadata"].get("annotations") or {}
        waiting = ann.get(hami.BIND_PHASE) == "allocating" or hami.ALLOCATED not in ann
        if kind != "DELETED" and obj["spec"].get("nodeName") and waiting:
            self.todo.put_nowait(key)

    def audit(self, n: dict) -> None:
        """Every card fairgpu put a pod on holds no more than its registered cores (devcore), memory and task
        count, and a cores-100 task on a 100-core card is alone (HAMi's Fit)."""
        node = n["metadata"]["name"]
        register = (n["metadata"].get("annotations") or {}).get(hami.NODE_REGISTER)
        caps = {d.uuid: (d.cores, d.memory_mib, d.count) for d in hami.decode_register(register)} if register else {}
        cores: dict[str, int] = defaultdict(int)
        mem: dict[str, int] = defaultdict(int)
        tasks: dict[str, int] = defaultdict(int)
        exclusive: set[str] = set()
        ours: set[str] = set()  # cards fairgpu put a pod on: the audit is of fairgpu's decisions
        for obj in self.informer.cache.values():
            ann = obj["metadata"].get("annotations") or {}
            if obj["spec"].get("nodeName") != node or hami.ALLOCATED not in ann:
                continue
            if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue  # its containers have exited: it holds no GPU
            try:
                segments = hami.decode_devices(ann[hami.ALLOCATED])
            except FormatError:
                continue  # another scheduler's unreadable record (fairgpu counts its cards as full)
            for seg in segments:
                for d in seg:
                    if obj["spec"].get("schedulerName") == "fairgpu":
                        ours.add(d.uuid)
                    cores[d.uuid] += d.cores
                    mem[d.uuid] += d.memory_mib
                    tasks[d.uuid] += 1
                    if d.cores >= 100:
                        exclusive.add(d.uuid)
        for uuid in tasks.keys() & ours:
            cap_cores, cap_mem, split = caps.get(uuid, (100, GPU_MEM, SPLIT))
            shared_whole = uuid in exclusive and tasks[uuid] > 1 and cap_cores == 100
            if cores[uuid] > cap_cores or mem[uuid] > cap_mem or tasks[uuid] > split or shared_whole:
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

    def _ended(self, key: str, at: float | None = None) -> None:
        runs = self.runs.get(key)
        if runs and len(runs[-1]) == 1:
            runs[-1].append(self.clock() if at is None else at)

    async def _exit(self, key: str, obj: dict, started: float, runtime: float) -> None:
        """The containers finish their work `runtime` after they started (whenever this loop gets to notice):
        the pod Succeeds, its containers' statuses saying when they ran, as a kubelet's do."""
        await self.sleep_until(started + runtime)
        self.busy += 1
        try:
            await self._finish_run(key, obj, started, runtime)
        finally:
            self.busy -= 1

    async def _finish_run(self, key: str, obj: dict, started: float, runtime: float) -> None:
        now = self.informer.cache.get(key)
        uid = obj["metadata"].get("uid")
        if now is None or now["metadata"].get("uid") != uid or now["metadata"].get("deletionTimestamp"):
            return  # evicted meanwhile
        ns, name = key.split("/", 1)
        self._ended(key, started + runtime)
        ran = {"startedAt": _stamp(started), "finishedAt": _stamp(started + runtime), "exitCode": 0}
        statuses = [{"name": c["name"], "state": {"terminated": ran}} for c in _containers(obj)]
        done = {"phase": "Succeeded", "conditions": [{"type": "Ready", "status": "False"}]}
        done["containerStatuses"] = statuses
        try:
            await self.port.patch(PODS, name, {"metadata": {"uid": uid}, "status": done}, ns, subresource="status")
        except KubeError as err:
            if err.code not in (404, 409):  # gone, or another pod of its name
                raise

    async def _stop(self, key: str, grace: float) -> None:
        """The containers ignore SIGTERM: the pod goes when its grace period is over."""
        await self.sleep_until(self.clock() + grace)
        ns, name = key.split("/", 1)
        self.busy += 1
        try:
            await self.port.delete(PODS, name, ns, grace_seconds=0)
        except KubeError as err:
            if err.code != 404:
                raise
        finally:
            self.busy -= 1

    async def _get_pod(self, ns: str, name: str) -> dict | None:
        try:
            return await self.port.get(PODS, name, ns)
        except KubeError as err:
            if err.code == 404:
                return None
            raise

    async def _allocate(self, key: str, obj: dict) -> None:
        self.busy += 1
        try:
            await self._start(key, obj)
        finally:
            self.busy -= 1

    async def _start(self, key: str, obj: dict) -> None:
        ns, name = key.split("/", 1)
        node = obj["spec"]["nodeName"]
        try:
            self.audit(await self.port.get(NODES, node))
            if any(r.GPU in _limits(c) for c in _containers(obj)):  # the kubelet calls HAMi's Allocate
                await self._device_plugin(key, obj, node)
            started = self.clock()
            running = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            state = {"running": {"startedAt": _stamp(started)}}
            running["containerStatuses"] = [{"name": c["name"], "state": state} for c in _containers(obj)]
            self.runs[key].append([started])  # the containers start; a deletion from now on ends the run
            uid = {"uid": obj["metadata"]["uid"]}  # never another pod made since under this name
            try:
                await self.port.patch(PODS, name, {"metadata": uid, "status": running}, ns, subresource="status")
            except KubeError as err:
                self.runs[key].pop()
                current = self.informer.cache.get(key)
                if err.code == 409 and (current is None or current["metadata"].get("uid") != uid["uid"]):
                    return  # this pod is gone; a new one of its name is allocated on its own
                raise
            runtime = (obj["metadata"].get("annotations") or {}).get(EXPECTED_RUNTIME)
            if self.complete and runtime is not None:
                self._spawn(self._exit(key, obj, started, parse_duration(runtime)))
        except AllocateError as err:
            self.violations.append(f"{key}: HAMi's device plugin would fail it: {err}")
        except KubeError as err:
            if err.code == 409:  # the node changed under us: try again
                self.started.discard(key)
                self.todo.put_nowait(key)
            elif err.code != 404:
                raise

    async def _device_plugin(self, key: str, obj: dict, node: str) -> None:
        n = await self.port.get(NODES, node)
        fetched: dict[tuple[str, str], dict | None] = {}
        lock = hami.NODE_LOCK in (n["metadata"].get("annotations") or {})
        if lock:
            owner = hami.decode_lock(n["metadata"]["annotations"][hami.NODE_LOCK])
            fetched[(owner.namespace, owner.pod)] = await self._get_pod(owner.namespace, owner.pod)
        try:
            on_node = [p for p in self.informer.cache.values() if p["spec"].get("nodeName") == node]
            alloc = hami_allocate(obj, n, lambda ns, name: fetched.get((ns, name)), on_node)
        except AllocateError:
            await self._finish(obj, n, "failed")
            raise
        self.allocations[key] = alloc
        if alloc.served != key:
            raise AllocateError(f"served {alloc.served}'s allocation (the node lock names it), not {key}'s")
        earlier = [p for p in on_node if f"{p['metadata']['namespace']}/{p['metadata']['name']}" in self.allocations
                   or (p.get("status") or {}).get("phase") == "Running"]  # fmt: skip
        expected = scheduler_limits(obj, n, earlier)
        if alloc.envs != expected:
            raise AllocateError(f"limits {alloc.envs} differ from HAMi's scheduler's {expected}")
        ns, name = key.split("/", 1)
        await self.port.patch(PODS, name, {"metadata": {"annotations": {hami.TO_ALLOCATE: alloc.erased}}}, ns)
        if not alloc.success:
            raise AllocateError(f"NVIDIA entries left unallocated in {alloc.erased!r}: the pod never succeeds")
        await self._finish(obj, n, "success")

    async def _finish(self, obj: dict, n: dict, phase: str) -> None:
        """bind-phase, then release the node lock only when it names this pod (ReleaseNodeLock)."""
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        await self.port.patch(PODS, name, {"metadata": {"annotations": {hami.BIND_PHASE: phase}}}, ns)
        for _ in range(5):  # HAMi retries the release on conflicts
            lock = (n["metadata"].get("annotations") or {}).get(hami.NODE_LOCK, "")
            if not lock.endswith(f",{ns},{name}"):
                return
            release = {"metadata": {"resourceVersion": n["metadata"]["resourceVersion"]}}
            release["metadata"]["annotations"] = {hami.NODE_LOCK: None}
            try:
                await self.port.patch(NODES, n["metadata"]["name"], release)
                return
            except KubeError as err:
                if err.code != 409:
                    raise
            n = await self.port.get(NODES, n["metadata"]["name"])
