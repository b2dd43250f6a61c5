"""Kubernetes objects → the engine's plain data: Node → NodeSpec (GPU inventory), Pod → PodInfo.

Inventory comes from HAMi's register annotation when present; without HAMi, from allocatable
`nvidia.com/gpu` and GPU feature discovery labels (whole GPUs only: nothing would enforce a share).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from fairgpu import resources as r
from fairgpu.errors import RequestError
from fairgpu.k8s import hami
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, gpu_request
from fairgpu.model.constraints import POLICIES, gpu_policy_chain
from fairgpu.model.pod import DEFAULT_RULES, GpuRules, parse_request
from fairgpu.spec import parse_duration
from fairgpu.state import ClusterState, Placement

QUEUE_LABEL = "fairgpu.io/queue"
USER_LABEL = "fairgpu.io/user"
POD_GROUP = "fairgpu.io/pod-group"
MIN_MEMBERS = "fairgpu.io/min-members"
SIG_POD_GROUP = "scheduling.x-k8s.io/pod-group"
EXPECTED_RUNTIME = "fairgpu.io/expected-runtime"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB
TERMINAL = ("Succeeded", "Failed")
_BEYOND_ANY_CARD = 2**31 - 1  # cores no card has (devcore is an int32), so hold() takes all the card has left


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
    """Raises hami.FormatError (naming the annotation) for an unreadable register annotation. MIG-mode cards
    are left out (see refused_gpus): fairgpu does not write HAMi's MIG allocations."""
    inputs = node if isinstance(node, NodeInputs) else NodeInputs.of(node)
    alloc, labels = inputs.allocatable, dict(inputs.labels)
    gpus: tuple[GpuDevice, ...] = ()
    split = 1  # without HAMi a GPU cannot be shared
    live = r.count(alloc.get(r.GPU, 0)) > 0  # HAMi v2.10 drops a node's devices when this is 0
    if live and inputs.register is not None:
        devices = [d for d in _nvidia(inputs.register) if d.mode != hami.MIG_MODE]
        cordoned = set(hami.uuid_list(inputs.cordon))
        gpus = tuple(
            GpuDevice(
                d.model,
                d.memory_mib,
                d.uuid,
                d.healthy and d.uuid not in cordoned,
                d.count,
                d.mode or "",
                d.cores,
                d.numa,
            )
            for d in devices
        )
        split = max((d.count for d in devices), default=1)  # each card carries its own count
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


def _nvidia(register: str) -> list[hami.RegisteredGpu]:
    # HAMi's scheduler counts a device as NVIDIA only if its type says so (score.go getNodeResources).
    return [d for d in hami.decode_register(register) if "nvidia" in d.model.lower()]


def refused_gpus(inputs: NodeInputs) -> str | None:
    """Why some of a node's GPUs are not scheduled by fairgpu (MIG mode), for an Event on the node."""
    if inputs.register is None or r.count(inputs.allocatable.get(r.GPU, 0)) == 0:
        return None
    mig = [d.uuid for d in _nvidia(inputs.register) if d.mode == hami.MIG_MODE]
    if not mig:
        return None
    return (
        f"{len(mig)} MIG-mode GPU(s) left out ({', '.join(mig)}): fairgpu does not write HAMi's "
        f"{hami.MIG_ALLOCATIONS}, without which HAMi's device plugin fails the pod; schedule MIG pods with HAMi"
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
    init_containers: int
    gpu_container: int | None  # index (init first) of the first container asking for GPUs
    gpu_containers: tuple[int, ...]  # every container (init first) asking for GPUs
    problem: str | None  # why fairgpu will not schedule this pod (it is still accounted where it runs)
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


def _resources(container: dict, gpu_names: tuple[str, ...]) -> dict[str, object]:
    res = container.get("resources") or {}
    merged = dict(res.get("requests") or {})
    for k, v in (res.get("limits") or {}).items():
        if k in gpu_names:
            merged[k] = v  # HAMi reads limits first for its resources
        else:
            merged.setdefault(k, v)  # Kubernetes defaults requests to limits
    return merged


def pod_info(pod: dict, rules: GpuRules = DEFAULT_RULES) -> PodInfo:
    """Raises RequestError naming the field for CPU or memory that is not a quantity. A GPU request fairgpu
    cannot schedule does not raise: it becomes `problem`, so a bound pod is still accounted."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    containers = list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    n_init = len(spec.get("initContainers") or [])
    gpus: list[tuple[int, GpuRequest]] = []
    problems: list[str] = []
    cpu_app = mem_app = cpu_init = mem_init = 0
    for i, c in enumerate(containers):
        req = _resources(c, rules.names)
        where = f"spec.{'initContainers' if i < n_init else 'containers'}[{i if i < n_init else i - n_init}]"
        try:
            cpu = parse_request(r.CPU, req.get(r.CPU, 0), r.cpu_millicores)
            mem = parse_request(r.MEMORY, req.get(r.MEMORY, 0), r.memory_mib)
        except RequestError as err:
            raise RequestError(err.problem, f"{where}.resources.{err.field}") from err
        try:
            g = gpu_request(req, rules)
        except RequestError as err:
            problems.append(f"{where}.resources.{err.field}: {err.problem}")
            g = None
        if g is not None:
            gpus.append((i, g))
            if rules.count_name not in ((c.get("resources") or {}).get("limits") or {}):
                # The kubelet calls HAMi's device plugin only for a container with this limit: without it the
                # allocation is never consumed and the node stays locked (HAMi's webhook, or fairgpu's, adds it).
                problems.append(f"{where}.resources.limits: {rules.count_name} is missing")
        if i < n_init:
            cpu_init, mem_init = max(cpu_init, cpu), max(mem_init, mem)
        else:
            cpu_app, mem_app = cpu_app + cpu, mem_app + mem
    if len(gpus) > 1 and gpus[0][0] < n_init:
        # HAMi fits each init container alone on the node's usage, then the app containers on top; fairgpu
        # places several GPU containers only in the app containers' way (each after the ones before it).
        problems.append(
            f"spec: {len(gpus)} containers ask for GPUs, one of them an init container; fairgpu schedules "
            "several GPU containers only among app containers"
        )
    selection, why = _selection(annotations)
    problems += why
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
        spec=PodSpec(
            max(cpu_app, cpu_init),
            max(mem_app, mem_init),
            gpus[0][1] if gpus else None,
            tuple(g for _, g in gpus[1:]),
            **selection,
        ),
        containers=len(containers),
        init_containers=n_init,
        gpu_container=gpus[0][0] if gpus else None,
        gpu_containers=tuple(i for i, _ in gpus),
        problem="; ".join(problems) or None,
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


def _selection(annotations: dict[str, str]) -> tuple[dict, list[str]]:
    """HAMi's per-pod selection annotations as PodSpec fields, and what in them fairgpu cannot honour."""
    problems: list[str] = []
    fields: dict = {
        "gpu_include": hami.uuid_list(annotations.get(hami.USE_GPUTYPE, "")),
        "gpu_exclude": hami.uuid_list(annotations.get(hami.NOUSE_GPUTYPE, "")),
        "gpu_uuid_include": hami.uuid_list(annotations.get(hami.USE_GPUUUID, "")),
        "gpu_uuid_exclude": hami.uuid_list(annotations.get(hami.NOUSE_GPUUUID, "")),
        "gpu_mode": annotations.get(hami.VGPU_MODE),
    }
    node_policy = annotations.get(hami.NODE_POLICY, "").strip()
    if node_policy in POLICIES or not node_policy:
        fields["node_policy"] = node_policy
    else:
        problems.append(
            f"metadata.annotations[{hami.NODE_POLICY}]: {node_policy!r} is not one of {', '.join(POLICIES)}"
        )
    try:
        fields["gpu_policy"], fields["gpu_mutex"] = gpu_policy_chain(annotations.get(hami.GPU_POLICY, ""))
    except ValueError as err:
        problems.append(f"metadata.annotations[{hami.GPU_POLICY}]: {err}")
    fields["numa_bind"] = hami.go_bool(annotations.get(hami.NUMA_BIND, "")) is True  # HAMi's assertNuma
    return fields, problems


def _timestamp(value: str | None) -> float:
    """An RFC 3339 time from the API as Unix seconds; 0 when absent."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else 0.0


def holdings(p: PodInfo, state: ClusterState, ni: int) -> tuple[list[Placement], str | None]:
    """What a bound pod holds on node `ni`, read from its HAMi record (`hami.io/vgpu-devices-allocated`)
    whatever its shape, and why part of it could not be read.

    One Placement when the record is one container's cards at one cores value (what fairgpu writes, and
    the engine can adopt as a pod); otherwise CPU and memory in one Placement and one per card entry (several
    GPU containers, init containers, cards shared between them). A record that does not decode names its
    cards as best it can and they count as fully used (see hold); a GPU pod without a record takes cards that
    fit its request, so none is booked twice.
    """
    spec, node = p.spec, state.nodes[ni]
    base = Placement(ni, cpu_m=spec.cpu_m, memory_mib=spec.memory_mib)
    raw = p.annotations.get(hami.ALLOCATED)
    if raw is None or p.annotations.get(hami.VGPU_NODE) != p.node:
        if spec.gpu is None:
            return [base], None
        fits = [s for s in range(len(node.gpus)) if state.fits(state.placement_for(spec, ni, (s,)))]
        if len(fits) < spec.gpu.count:
            return [base], f"GPU pod on {node.name} without a HAMi allocation record, and no room for its GPUs"
        return [state.placement_for(spec, ni, fits[: spec.gpu.count])], None
    slot_of = {g.uuid: j for j, g in enumerate(node.gpus)}
    try:
        segments = hami.decode_devices(raw)
    except hami.FormatError as err:
        named = {slot_of[u] for u in re.split(r"[,:;]", raw) if u in slot_of}
        blocked = [Placement(ni, (s,), (_BEYOND_ANY_CARD,), (0,)) for s in sorted(named)]  # blocks (see hold)
        return [base, *blocked], f"{err}; its cards count as fully used"
    entries = [d for seg in segments for d in seg if d.uuid in slot_of]
    foreign = sorted({d.uuid for seg in segments for d in seg if d.uuid not in slot_of})
    problem = f"cards not in {node.name}'s HAMi inventory (MIG, or gone): {', '.join(foreign)}" if foreign else None
    filled = [seg for seg in segments if seg]
    if (
        filled
        and not foreign
        and (len(filled) == 1 or not any(segments[: p.init_containers]))
        and all(len({d.uuid for d in seg}) == len(seg) for seg in filled)
    ):  # one GPU container's cards, or app containers' in turn, as fairgpu writes them: one Placement
        entries = [d for seg in filled for d in seg]
        return [
            Placement(
                ni,
                tuple(slot_of[d.uuid] for d in entries),
                tuple(d.cores for d in entries),
                tuple(d.memory_mib for d in entries),
                spec.cpu_m,
                spec.memory_mib,
                tuple(len(seg) for seg in filled) if len(filled) > 1 else (),
            )
        ], None
    cards = _collapse_init(segments[: p.init_containers], segments[p.init_containers :])
    held = [
        Placement(ni, (slot_of[uuid],), (cores if k == 0 else 0,), (mem if k == 0 else 0,))
        for uuid, (mem, cores, tasks) in cards.items()
        if uuid in slot_of
        for k in range(tasks)
    ]
    return [base, *held], problem


def _collapse_init(
    init: list[list[hami.DeviceUse]], app: list[list[hami.DeviceUse]]
) -> dict[str, tuple[int, int, int]]:
    """HAMi's `CollapseInitContainerUsage` (pkg/device/initContainer.go): init containers run one at a time
    before the app containers, so per card a pod holds max(init peak, app sum) of memory and of cores, and
    max(1 if an init container used it, app entries) task slots. Returns uuid → (MiB, cores, tasks)."""
    peak: dict[str, tuple[int, int]] = {}
    total: dict[str, tuple[int, int, int]] = {}
    for seg in init:
        for d in seg:
            m, c = peak.get(d.uuid, (0, 0))
            peak[d.uuid] = (max(m, d.memory_mib), max(c, d.cores))
    for seg in app:
        for d in seg:
            m, c, t = total.get(d.uuid, (0, 0, 0))
            total[d.uuid] = (m + d.memory_mib, c + d.cores, t + 1)
    out = {}
    for uuid in [*peak, *(u for u in total if u not in peak)]:
        (im, ic), (am, ac, at) = peak.get(uuid, (0, 0)), total.get(uuid, (0, 0, 0))
        out[uuid] = (max(im, am), max(ic, ac), max(1 if uuid in peak else 0, at, 1))
    return out


def hold(state: ClusterState, key: str, placements: list[Placement]) -> tuple[list[str], list[str]]:
    """Assign a bound pod's holdings under ledger keys `key`, `key#1`, …; an entry that does not fit (a card
    over-committed, cores over 100, an unreadable record) takes whatever the card still has, so the card
    counts as fully used and nothing else is booked on it. Returns the keys held and what did not fit."""
    keys: list[str] = []
    problems: list[str] = []
    for i, pl in enumerate(placements):
        k = key if i == 0 else f"{key}#{i}"
        if state.fits(pl):
            state.assign(k, pl)
            keys.append(k)
            continue
        name = state.node_names[pl.node]
        problems.append(f"{name}: {'GPU ' + str(list(pl.slots)) if pl.slots else 'CPU/memory'} over capacity")
        for s in pl.slots:
            rest = Placement(
                pl.node, (s,), (int(state.gpu_cores_free[pl.node, s]),), (int(state.gpu_mem_free[pl.node, s]),)
            )
            if (rest.cores[0] or rest.mem_mib[0]) and state.fits(rest):
                state.assign(f"{k}@{s}", rest)
                keys.append(f"{k}@{s}")
    return keys, problems
