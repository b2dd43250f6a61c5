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
from fairgpu.model import GpuDevice, GpuRequest, NodeSpec, PodSpec, gpu_request
from fairgpu.model.constraints import (
    POLICIES,
    TAINT_EFFECTS,
    MatchExpression,
    Taint,
    Toleration,
    gpu_policy_names,
    scoring_weights,
)
from fairgpu.model.node import MigTemplate
from fairgpu.model.pod import DEFAULT_RULES, GpuRules, parse_request
from fairgpu.spec import parse_duration

QUEUE_LABEL = "fairgpu.io/queue"
USER_LABEL = "fairgpu.io/user"
POD_GROUP = "fairgpu.io/pod-group"
MIN_MEMBERS = "fairgpu.io/min-members"
SIG_POD_GROUP = "scheduling.x-k8s.io/pod-group"
EXPECTED_RUNTIME = "fairgpu.io/expected-runtime"
GFD_PRODUCT = "nvidia.com/gpu.product"
GFD_MEMORY = "nvidia.com/gpu.memory"  # MiB
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
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect) of spec.taints
    pair_scores: str | None = None  # hami.io/node-nvidia-score

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
            tuple(
                (str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
                for t in (node.get("spec") or {}).get("taints") or []
                if t.get("key") and t.get("effect") in TAINT_EFFECTS
            ),
            annotations.get(hami.NODE_SCORE),
        )


def node_spec(node: dict | NodeInputs) -> NodeSpec:
    """Raises hami.FormatError (naming the annotation) for an unreadable register or pair score annotation (HAMi
    then drops the node's devices; fairgpu leaves the node out). MIG-mode cards
    carry the MIG profiles they registered; one that registered none is left out (see refused_gpus)."""
    inputs = node if isinstance(node, NodeInputs) else NodeInputs.of(node)
    alloc, labels = inputs.allocatable, dict(inputs.labels)
    gpus: tuple[GpuDevice, ...] = ()
    pairs: tuple[tuple[int, ...], ...] = ()
    split = 1  # without HAMi a GPU cannot be shared
    live = r.count(alloc.get(r.GPU, 0)) > 0  # HAMi v2.10 drops a node's devices when this is 0
    if live and inputs.register is not None:
        devices = [d for d in _nvidia(inputs.register) if d.mode != hami.MIG_MODE or d.mig_profiles]
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
                tuple(MigTemplate(p.name, p.memory_mib, p.cores, p.slices, p.placements) for p in d.mig_profiles)
                if d.mode == hami.MIG_MODE
                else (),
            )
            for d in devices
        )
        split = max((d.count for d in devices), default=1)  # each card carries its own count
        if inputs.pair_scores is not None:
            scores = hami.decode_pair_scores(inputs.pair_scores)
            pairs = tuple(tuple(0 if a.uuid == b.uuid else scores.get(a.uuid, {}).get(b.uuid, 0) for b in gpus)
                          for a in gpus)  # fmt: skip
            pairs = pairs if any(map(any, pairs)) else ()
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
        taints=tuple(Taint(k, v, e) for k, v, e in inputs.taints),
        pair_scores=pairs,
    )


def _nvidia(register: str) -> list[hami.RegisteredGpu]:
    # HAMi's scheduler counts a device as NVIDIA only if its type says so (score.go getNodeResources).
    return [d for d in hami.decode_register(register) if "nvidia" in d.model.lower()]


def refused_gpus(inputs: NodeInputs) -> str | None:
    """Why some of a node's GPUs are not scheduled by fairgpu (MIG mode without MIG profiles), for an Event."""
    if inputs.register is None or r.count(inputs.allocatable.get(r.GPU, 0)) == 0:
        return None
    mig = [d.uuid for d in _nvidia(inputs.register) if d.mode == hami.MIG_MODE and not d.mig_profiles]
    if not mig:
        return None
    return (
        f"{len(mig)} MIG-mode GPU(s) left out ({', '.join(mig)}): they registered no migProfiles, so no MIG "
        f"instance can be chosen for {hami.MIG_ALLOCATIONS} (HAMi's Fit refuses them too)"
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
    gated: bool = False  # spec.schedulingGates not yet all removed: no scheduler may bind it (the API server refuses)

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
    constraints, why = _placement_rules(spec)
    selection.update(constraints)
    problems += why
    group = labels.get(POD_GROUP) or labels.get(SIG_POD_GROUP)
    # A tenant may still change these after admission: an unreadable value is a problem, never an exception,
    # so a running pod stays accounted (an exception made it unreadable, taken for gone, its GPUs freed).
    min_members = 1
    raw = labels.get(MIN_MEMBERS) or annotations.get(MIN_MEMBERS)
    if raw:
        try:
            min_members = int(raw)
        except ValueError:
            where = "labels" if labels.get(MIN_MEMBERS) else "annotations"
            problems.append(f"metadata.{where}[{MIN_MEMBERS}]: {raw!r} is not a number")
    duration = None
    if EXPECTED_RUNTIME in annotations:
        try:
            duration = parse_duration(annotations[EXPECTED_RUNTIME])
        except ValueError as err:
            problems.append(f"metadata.annotations[{EXPECTED_RUNTIME}]: {err}")
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
        gated=bool(spec.get("schedulingGates")),
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
    try:  # kept as written: HAMi tells a chain from a single policy by its commas
        gpu_policy_names(policy := annotations.get(hami.GPU_POLICY, ""))
        fields["gpu_policy"] = policy
    except ValueError as err:
        problems.append(f"metadata.annotations[{hami.GPU_POLICY}]: {err}")
    if hami.SCORING_WEIGHTS in annotations:  # HAMi fails the pod's scheduling on a bad value, as fairgpu does
        try:
            fields["gpu_weights"] = scoring_weights(annotations[hami.SCORING_WEIGHTS])
        except ValueError as err:
            problems.append(f"metadata.annotations[{hami.SCORING_WEIGHTS}]: {err}")
    fields["numa_bind"] = hami.go_bool(annotations.get(hami.NUMA_BIND, "")) is True  # HAMi's assertNuma
    return fields, problems


def _placement_rules(spec: dict) -> tuple[dict, list[str]]:
    """Where kube-scheduler would let the pod run: spec.nodeSelector, the required node affinity terms and
    spec.tolerations, as PodSpec fields; what cannot be honoured is a problem (the pod is not scheduled),
    never ignored: ignoring it could bind the pod where its owner excluded it."""
    problems: list[str] = []
    fields: dict = {}
    selector = spec.get("nodeSelector") or {}
    if isinstance(selector, dict):
        fields["node_selector"] = tuple(sorted((str(k), str(v)) for k, v in selector.items()))
    else:
        problems.append("spec.nodeSelector: must be a map of label keys to values")
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = []
    for i, term in enumerate(required.get("nodeSelectorTerms") or []):
        at = f"spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
        if term.get("matchFields"):
            problems.append(f"{at}.matchFields: not supported by fairgpu (use matchExpressions on node labels)")
            continue
        try:
            terms.append(
                tuple(
                    MatchExpression(
                        str(e.get("key", "")), str(e.get("operator", "")), tuple(map(str, e.get("values") or ()))
                    )
                    for e in term.get("matchExpressions") or []
                )
            )
        except ValueError as err:
            problems.append(f"{at}.matchExpressions: {err}")
    fields["affinity"] = tuple(terms)
    tolerations = []
    for i, t in enumerate(spec.get("tolerations") or []):
        try:
            tolerations.append(
                Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
                           str(t.get("effect") or ""))
            )  # fmt: skip
        except ValueError as err:
            problems.append(f"spec.tolerations[{i}]: {err}")
    fields["tolerations"] = tuple(tolerations)
    return fields, problems


def _timestamp(value: str | None) -> float:
    """An RFC 3339 time from the API as Unix seconds; 0 when absent."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else 0.0
