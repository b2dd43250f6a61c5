"""Kubernetes objects → the engine's plain data: Node → NodeSpec (GPU inventory), Pod → PodInfo.

Inventory comes from HAMi's register annotation when present; without HAMi, from allocatable
`nvidia.com/gpu` and GPU feature discovery labels (whole GPUs only: nothing would enforce a share).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from fairgpu import resources as r
from fairgpu.errors import RequestError
from fairgpu.k8s import hami
from fairgpu.model import GpuDevice, NodeSpec, PodSpec, gpu_request
from fairgpu.model.pod import parse_request
from fairgpu.spec import parse_duration

QUEUE_LABEL = "fairgpu.io/queue"
USER_LABEL = "fairgpu.io/user"
POD_GROUP = "fairgpu.io/pod-group"
MIN_MEMBERS = "fairgpu.io/min-members"
SIG_POD_GROUP = "scheduling.x-k8s.io/pod-group"
EXPECTED_RUNTIME = "fairgpu.io/expected-runtime"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB
USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
TERMINAL = ("Succeeded", "Failed")


@dataclass(slots=True, frozen=True)
class NodeInputs:
    """Everything node_spec reads of a Node. Most node writes (HAMi's lock, its handshake, kubelet
    heartbeats) change none of it, so a caller keeps the parsed spec while these compare equal."""

    name: str
    allocatable: dict
    register: str | None
    cordon: str
    labels: dict
    unschedulable: bool

    @classmethod
    def of(cls, node: dict) -> NodeInputs:
        meta = node["metadata"]
        annotations = meta.get("annotations") or {}
        return cls(
            meta["name"],
            (node.get("status") or {}).get("allocatable") or {},
            annotations.get(hami.NODE_REGISTER),
            annotations.get(hami.DEVICE_CORDON, ""),
            meta.get("labels") or {},
            bool((node.get("spec") or {}).get("unschedulable", False)),
        )


def node_spec(node: dict | NodeInputs) -> NodeSpec:
    """Raises hami.FormatError (naming the annotation) for an unreadable register annotation."""
    inputs = node if isinstance(node, NodeInputs) else NodeInputs.of(node)
    alloc, labels = inputs.allocatable, dict(inputs.labels)
    gpus: tuple[GpuDevice, ...] = ()
    split = 1  # without HAMi a GPU cannot be shared
    live = r.count(alloc.get(r.GPU, 0)) > 0  # HAMi v2.10 drops a node's devices when this is 0
    if live and inputs.register is not None:
        devices = [d for d in hami.decode_register(inputs.register) if "nvidia" in d.model.lower()]
        cordoned = {u.strip() for u in inputs.cordon.split(",") if u.strip()}
        gpus = tuple(GpuDevice(d.model, d.memory_mib, d.uuid, d.healthy and d.uuid not in cordoned) for d in devices)
        split = min((d.count for d in devices), default=1)
    elif live:
        model = labels.get(GFD_PRODUCT, "nvidia-gpu")
        mem = int(labels.get(GFD_MEMORY, "0") or 0)
        gpus = tuple(GpuDevice(model, mem, f"{inputs.name}-gpu{i}") for i in range(r.count(alloc[r.GPU])))
    return NodeSpec(
        name=inputs.name,
        cpu_m=r.cpu_millicores(alloc.get("cpu", 0)),
        memory_mib=r.memory_mib(alloc.get("memory", 0)),
        gpus=gpus,
        labels=labels,
        split_count=max(1, split),
        schedulable=not inputs.unschedulable,
    )


@dataclass(slots=True)
class PodInfo:
    """What the controller needs to know about one pod, read once from its JSON."""

    key: str  # namespace/name
    namespace: str
    name: str
    uid: str
    spec: PodSpec
    containers: int  # init + app containers, the device string's segment count
    gpu_container: int | None  # index (init first) of the one container asking for GPUs
    scheduler: str
    node: str | None
    phase: str
    created: float
    started: float  # status.startTime (the kubelet took it), else the creation time
    priority: int
    user: str
    queue_label: str | None
    group: str | None
    min_members: int
    duration: float | None
    annotations: dict[str, str]
    deleting: bool

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL


def _resources(container: dict) -> dict[str, object]:
    res = container.get("resources") or {}
    merged = dict(res.get("requests") or {})
    for k, v in (res.get("limits") or {}).items():
        if k in (r.GPU, r.GPUCORES, r.GPUMEM, r.GPUMEM_PCT):
            merged[k] = v  # HAMi reads limits first for its resources
        else:
            merged.setdefault(k, v)  # Kubernetes defaults requests to limits
    return merged


def pod_info(pod: dict) -> PodInfo:
    """Raises RequestError naming the field for a request fairgpu cannot place."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    n_init = len(spec.get("initContainers") or [])
    gpu_container, gpu = None, None
    cpu_app = mem_app = cpu_init = mem_init = 0
    for i, c in enumerate(containers):
        req = _resources(c)
        where = f"spec.{'initContainers' if i < n_init else 'containers'}[{i if i < n_init else i - n_init}]"
        try:
            g = gpu_request(req)
            cpu = parse_request(r.CPU, req.get(r.CPU, 0), r.cpu_millicores)
            mem = parse_request(r.MEMORY, req.get(r.MEMORY, 0), r.memory_mib)
        except RequestError as err:
            raise RequestError(err.problem, f"{where}.resources.{err.field}") from err
        if g is not None:
            if gpu is not None:
                raise RequestError("only one container of a pod may request GPUs", f"{where}.resources")
            gpu, gpu_container = g, i
        if i < n_init:
            cpu_init, mem_init = max(cpu_init, cpu), max(mem_init, mem)
        else:
            cpu_app, mem_app = cpu_app + cpu, mem_app + mem
    include = tuple(s.strip() for s in annotations.get(USE_GPUTYPE, "").split(",") if s.strip())
    exclude = tuple(s.strip() for s in annotations.get(NOUSE_GPUTYPE, "").split(",") if s.strip())
    group = labels.get(POD_GROUP) or labels.get(SIG_POD_GROUP)
    try:
        min_members = int(labels.get(MIN_MEMBERS) or annotations.get(MIN_MEMBERS) or 1)
    except ValueError as err:
        raise RequestError(f"{labels.get(MIN_MEMBERS)!r} is not a number", f"metadata.labels[{MIN_MEMBERS}]") from err
    duration = None
    if EXPECTED_RUNTIME in annotations:
        try:
            duration = parse_duration(annotations[EXPECTED_RUNTIME])
        except ValueError as err:
            raise RequestError(str(err), f"metadata.annotations[{EXPECTED_RUNTIME}]") from err
    created = _timestamp(meta.get("creationTimestamp"))
    return PodInfo(
        key=f"{meta.get('namespace', '')}/{meta['name']}",
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        uid=meta.get("uid", ""),
        spec=PodSpec(max(cpu_app, cpu_init), max(mem_app, mem_init), gpu, include, exclude),
        containers=len(containers),
        gpu_container=gpu_container,
        scheduler=spec.get("schedulerName", "default-scheduler"),
        node=spec.get("nodeName") or None,
        phase=status.get("phase", "Pending"),
        created=created,
        started=_timestamp(status.get("startTime")) or created,
        priority=int(spec.get("priority") or 0),
        user=labels.get(USER_LABEL, ""),
        queue_label=labels.get(QUEUE_LABEL),
        group=group,
        min_members=max(1, min_members),
        duration=duration,
        annotations=dict(annotations),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _timestamp(value: str | None) -> float:
    """An RFC 3339 time from the API as Unix seconds; 0 when absent."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else 0.0
