"""Admission webhook (admission.k8s.io/v1): tenant GPU pods are scheduled by fairgpu or not at all, carry the
user who made them, and cannot name another tenant's queue.

Mutating, at CREATE: GPU pods get `schedulerName: fairgpu`, the user stamp (identity.py) and HAMi's defaults
written out (gpu alone → gpucores 100; gpucores or gpumem alone → gpu 1), since HAMi's own webhook skips
pods that name another scheduler. Workloads that make pods (Jobs, training jobs, ...) get the stamp on their
pod templates at CREATE, and keep it unchanged on UPDATE, so their pods carry their creator's name.
Validating: what fairgpu reads to place and account a pod (spec.nodeName, HAMi's allocation annotations,
fairgpu's control labels and annotations) is written by fairgpu alone (and the trusted identities); a GPU
request fairgpu could never honour and a queue the namespace may not use are refused at CREATE. UPDATE
checks compare the old and new pod only: they never depend on state that changes (a deleted queue), and
never block a change that does not touch scheduling (finalizers, status, other labels).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fairgpu import resources as r
from fairgpu.errors import RequestError
from fairgpu.hamiconfig import DEFAULT as DEFAULT_HAMI
from fairgpu.hamiconfig import HamiConfig
from fairgpu.k8s.identity import (
    QUEUE_LABEL,
    TEMPLATE_KINDS,
    UNATTRIBUTED,
    USER_ANNOTATION,
    USER_LABEL,
    Trust,
    at,
    is_control_key,
    owner_of,
    pod_templates,
    user_label,
)
from fairgpu.k8s.translate import pod_info
from fairgpu.model import gpu_request
from fairgpu.model.pod import DEFAULT_RULES, GpuRules, webhook_defaults

GPU_RESOURCES = (r.GPU, r.GPUCORES, r.GPUMEM, r.GPUMEM_PCT)
# queue name → namespaces allowed to use it (empty: any); None when the queue does not exist
QueueLookup = Callable[[str], tuple[str, ...] | None]
Stamp = dict[str, dict[str, str | None]]  # metadata field (labels, annotations) → key → value (None: absent)
# The largest AdmissionReview read. aiohttp's default (1 MiB) answered 413 to reviews the API server sends: it
# accepts request bodies of 3 MiB, and an UPDATE's review carries the object twice. A 413 is a failed call, so
# a large GPU pod was refused (failurePolicy Fail) and a large workload's UPDATE skipped the webhook (Ignore),
# keeping a template stamp its owner had rewritten.
MAX_REVIEW = 8 * 1024 * 1024


class UserInfo(BaseModel):
    model_config = ConfigDict(extra="allow")
    username: str = ""


class AdmissionRequest(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    uid: str
    kind: dict[str, str]
    namespace: str = ""
    operation: str
    user_info: UserInfo = Field(default_factory=UserInfo, alias="userInfo")
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(default=None, alias="oldObject")


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    api_version: str = Field(alias="apiVersion")
    kind: str
    request: AdmissionRequest


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _containers(pod: dict) -> list[dict]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def wants_gpu(pod: dict, names: tuple[str, ...] = GPU_RESOURCES) -> bool:
    for c in _containers(pod):
        res = c.get("resources") or {}
        if any(k in (res.get("limits") or {}) or k in (res.get("requests") or {}) for k in names):
            return True
    return False


def stamp(meta: dict, requester: str, trust: Trust) -> Stamp:
    """The user an object created by `requester` is charged to: the requester, unless a controller (or a
    trusted identity) creates it from a template that carries a user already. A controller's object from a
    template that carries none (its workload was created while the webhook was down) is charged to no one:
    it names its owner in UNATTRIBUTED instead, and waits. These are the control keys the mutating webhook
    writes at CREATE, and so the only ones check_create accepts from a tenant: a control key injected at
    CREATE by another function of this module must be returned here too."""
    carried = (meta.get("annotations") or {}).get(USER_ANNOTATION)
    if carried and trust.keeps_stamp(requester):
        user = carried
    elif trust.attributes(requester):
        user = requester
    else:
        return {"labels": {USER_LABEL: None}, "annotations": {USER_ANNOTATION: None, UNATTRIBUTED: owner_of(meta)}}
    return {"labels": {USER_LABEL: user_label(user)}, "annotations": {USER_ANNOTATION: user, UNATTRIBUTED: None}}


def _sync(obj: dict, base: tuple[str, ...], want: Stamp) -> list[dict]:
    """JSON patch operations that make the metadata at `base` carry `want` (None: remove the key)."""
    node = at(obj, base)
    if not isinstance(node, dict):
        return []
    prefix = "".join(f"/{_escape(p)}" for p in base) + "/metadata"
    ops: list[dict] = []
    meta = node.get("metadata")
    if not isinstance(meta, dict):
        if not any(v is not None for values in want.values() for v in values.values()):
            return []
        ops.append({"op": "add", "path": prefix, "value": {}})
        meta = {}
    for field, values in want.items():
        have = meta.get(field)
        for key, value in values.items():
            current = have.get(key) if isinstance(have, dict) else None
            if current == value:
                continue
            if value is None:
                ops.append({"op": "remove", "path": f"{prefix}/{field}/{_escape(key)}"})
                continue
            if not isinstance(have, dict):
                ops.append({"op": "add", "path": f"{prefix}/{field}", "value": {}})
                have = {}
            ops.append({"op": "add", "path": f"{prefix}/{field}/{_escape(key)}", "value": value})
    return ops


def mutate(
    pod: dict, user: str, scheduler_name: str, trust: Trust | None = None, config: HamiConfig = DEFAULT_HAMI
) -> list[dict]:
    """JSON patch operations for a pod at CREATE; none for a pod that neither asks for a GPU nor names fairgpu.
    GPU requests use HAMi's configured resource names; its webhook defaults and injections are applied."""
    rules = config.rules()
    gpu = wants_gpu(pod, rules.names)
    if not gpu and (pod.get("spec") or {}).get("schedulerName") != scheduler_name:
        return []
    ops: list[dict] = []
    if gpu and (pod.get("spec") or {}).get("schedulerName") != scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    ops += _sync(pod, (), stamp(pod.get("metadata") or {}, user, trust or Trust()))
    ops += _hami_defaults(pod, rules)
    return ops + hami_injections(pod, config)


def _hami_defaults(pod: dict, rules: GpuRules) -> list[dict]:
    ops: list[dict] = []
    spec = pod.get("spec") or {}
    for field in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field) or []):
            res = c.get("resources") or {}
            given = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            if not any(k in given for k in rules.names):
                continue
            # HAMi's webhook defaults (model.pod.webhook_defaults), which its own webhook skips for our pods
            add = {k: str(v) for k, v in webhook_defaults(given, rules).items() if k not in given}
            base = f"/spec/{field}/{i}/resources"
            if add and "resources" not in c:
                ops.append({"op": "add", "path": base, "value": {}})
            if add and "limits" not in res:
                ops.append({"op": "add", "path": f"{base}/limits", "value": {}})
            ops += [{"op": "add", "path": f"{base}/limits/{_escape(k)}", "value": v} for k, v in add.items()]
    return ops


def hami_injections(pod: dict, config: HamiConfig) -> list[dict]:
    """JSON patch operations for what HAMi's webhook (`MutateAdmission`, pkg/device/nvidia/device.go) writes
    into a pod it admits, since it skips pods that name another scheduler: on each container, env
    CUDA_TASK_PRIORITY from its priority resource and GPU_CORE_UTILIZATION_POLICY when gpuCorePolicy is set
    and not `default` (HAMi adds it to every container); the pod's runtimeClassName when a container asks
    for GPUs and the pod names none. None for a pod without GPU requests."""
    rules = config.rules()
    if not wants_gpu(pod, rules.names):
        return []
    spec = pod.get("spec") or {}
    ops: list[dict] = []
    for field in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(field) or []):
            env: list[dict] = []
            limits = (c.get("resources") or {}).get("limits") or {}
            if config.resource_priority_name in limits:
                value = int(r.parse_quantity(limits[config.resource_priority_name]).to_integral_value("ROUND_CEILING"))
                env.append({"name": "CUDA_TASK_PRIORITY", "value": str(value)})
            if config.gpu_core_policy not in ("", "default"):
                env.append({"name": "GPU_CORE_UTILIZATION_POLICY", "value": config.gpu_core_policy})
            if not env:
                continue
            base = f"/spec/{field}/{i}/env"
            if c.get("env") is None:
                ops.append({"op": "add", "path": base, "value": env})
            else:
                ops += [{"op": "add", "path": f"{base}/-", "value": e} for e in env]
    gpu = any(_asks_gpu(c, rules) for c in _containers(pod))
    if gpu and config.runtime_class_name and spec.get("runtimeClassName") is None:
        ops.append({"op": "add", "path": "/spec/runtimeClassName", "value": config.runtime_class_name})
    return ops


def _asks_gpu(c: dict, rules: GpuRules) -> bool:
    """The container asks for a GPU; a request that does not read is none here (validation refuses it)."""
    try:
        return gpu_request(_container_resources(c), rules) is not None
    except (RequestError, ValueError):
        return False


def _container_resources(c: dict) -> dict:
    res = c.get("resources") or {}
    return {**(res.get("requests") or {}), **(res.get("limits") or {})}


def mutate_workload(req: AdmissionRequest, trust: Trust) -> list[dict]:
    """A workload's pod templates carry its creator at CREATE (whatever the user wrote there); at UPDATE
    they keep what they had, so the stamp can neither be forged nor moved to someone else later."""
    obj, group, kind = req.object or {}, req.kind.get("group", ""), req.kind.get("kind", "")
    ops: list[dict] = []
    for path in pod_templates(group, kind, obj):
        if req.operation == "CREATE":
            meta = at(obj, (*path, "metadata"))
            want: Stamp = stamp(meta if isinstance(meta, dict) else {}, req.user_info.username, trust)
        else:
            old = at(req.old_object or {}, (*path, "metadata"))
            old = old if isinstance(old, dict) else {}
            labels, annotations = old.get("labels") or {}, old.get("annotations") or {}
            want = {
                "labels": {USER_LABEL: labels.get(USER_LABEL)},
                "annotations": {k: annotations.get(k) for k in (USER_ANNOTATION, UNATTRIBUTED)},
            }
        ops += _sync(obj, path, want)
    return ops


def concerns(pod: dict, scheduler_name: str, rules: GpuRules = DEFAULT_RULES) -> bool:
    """Pods fairgpu reads: GPU pods, pods naming it, and pods carrying its or HAMi's control keys (a forged
    allocation on any pod would book a GPU)."""
    meta = pod.get("metadata") or {}
    keys = list(meta.get("labels") or {}) + list(meta.get("annotations") or {})
    named = (pod.get("spec") or {}).get("schedulerName") == scheduler_name
    return wants_gpu(pod, rules.names) or named or any(is_control_key(k) for k in keys)


def validate(pod: dict, namespace: str, queues: QueueLookup, rules: GpuRules = DEFAULT_RULES) -> str | None:
    """Why a new pod's GPU request or queue must be refused; None to admit it."""
    pod = {**pod, "metadata": {"name": "pending-name", **(pod.get("metadata") or {}), "namespace": namespace}}
    try:
        problem = pod_info(pod, rules).problem
        if problem is not None:
            return problem
        pct_name = rules.names[2]
        for c in _containers(pod):  # HAMi's webhook refuses what its scheduler would clamp
            pct = _container_resources(c).get(pct_name)
            if pct is not None and not 0 <= r.parse_quantity(pct) <= 100:
                return f"{pct_name}: {pct} must be between 0 and 100 (container {c.get('name')})"
    except (RequestError, ValueError) as err:
        return str(err)
    queue = ((pod.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    if queue is not None and wants_gpu(pod, rules.names):
        allowed = queues(queue)
        if allowed is None:
            return f"metadata.labels[{QUEUE_LABEL}]: queue {queue!r} does not exist"
        if allowed and namespace not in allowed:
            return f"metadata.labels[{QUEUE_LABEL}]: namespace {namespace} may not use queue {queue!r}"
    return None


def check_create(
    pod: dict,
    namespace: str,
    user: str,
    trust: Trust,
    queues: QueueLookup,
    scheduler: str,
    rules: GpuRules = DEFAULT_RULES,
) -> str | None:
    problem = validate(pod, namespace, queues, rules)
    if problem is not None or trust.full(user) or not concerns(pod, scheduler, rules):
        return problem
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    gpu = wants_gpu(pod, rules.names)
    if gpu:
        if spec.get("nodeName"):
            return f"spec.nodeName: GPU pods are placed by {scheduler}; {user} may not choose the node"
        if spec.get("schedulerName") != scheduler:
            return f"spec.schedulerName: GPU pods are scheduled by {scheduler}, not {spec.get('schedulerName')!r}"
    named = gpu or spec.get("schedulerName") == scheduler
    want = stamp(meta, user, trust) if named else {"labels": {}, "annotations": {}}
    for field in ("labels", "annotations"):
        have = meta.get(field) or {}
        for key in sorted(set(have) | set(want[field])):
            if (is_control_key(key) or key in want[field]) and have.get(key) != want[field].get(key):
                return f"metadata.{field}[{key}]: set by {scheduler} only; {user} may not write it"
    return None


def check_update(old: dict, new: dict, user: str, trust: Trust, scheduler: str) -> str | None:
    """Only what fairgpu reads to place and account a pod is protected; everything else may change."""
    if trust.full(user):
        return None
    for field in ("labels", "annotations"):
        before = (old.get("metadata") or {}).get(field) or {}
        after = (new.get("metadata") or {}).get(field) or {}
        for key in sorted(set(before) | set(after)):
            protected = is_control_key(key) or (field == "labels" and key == QUEUE_LABEL)
            if protected and before.get(key) != after.get(key):
                return f"metadata.{field}[{key}]: changed by {scheduler} only; {user} may not change it"
    if (old.get("spec") or {}).get("nodeName") != (new.get("spec") or {}).get("nodeName"):
        return f"spec.nodeName: set by {scheduler} only"
    return None


def _review(req: AdmissionRequest, response: dict) -> web.Response:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": req.uid, **response}}
    return web.json_response(body)


def _patched(req: AdmissionRequest, ops: list[dict]) -> web.Response:
    if not ops:
        return _review(req, {"allowed": True})
    patch = base64.b64encode(json.dumps(ops).encode()).decode()
    return _review(req, {"allowed": True, "patchType": "JSONPatch", "patch": patch})


async def _parse(request: web.Request) -> AdmissionReview | web.Response:
    try:
        return AdmissionReview.model_validate(await request.json())
    except (ValidationError, ValueError) as err:
        return web.json_response({"error": f"not an AdmissionReview: {err}"}, status=400)


def webhook_app(
    queues: QueueLookup,
    scheduler_name: str = "fairgpu",
    trust: Trust | Callable[[], Trust] | None = None,
    config: HamiConfig = DEFAULT_HAMI,
) -> web.Application:
    """The webhook's handlers. `trust` may be a callable asked at every request (identity.TrustedIdentities,
    which follows the mounted ConfigMap)."""
    fixed = trust or Trust()
    current = fixed if callable(fixed) else lambda: fixed
    rules = config.rules()

    async def mutate_handler(request: web.Request) -> web.Response:
        review = await _parse(request)
        if isinstance(review, web.Response):
            return review
        req = review.request
        if req.object is None:
            return _review(req, {"allowed": True})
        workload = (req.kind.get("group", ""), req.kind.get("kind")) in TEMPLATE_KINDS
        if workload and req.operation in ("CREATE", "UPDATE"):
            return _patched(req, mutate_workload(req, current()))
        if req.kind.get("kind") != "Pod" or req.operation != "CREATE":
            return _review(req, {"allowed": True})
        return _patched(req, mutate(req.object, req.user_info.username, scheduler_name, current(), config))

    async def validate_handler(request: web.Request) -> web.Response:
        review = await _parse(request)
        if isinstance(review, web.Response):
            return review
        req = review.request
        problem = None
        if req.kind.get("kind") == "Pod" and req.object is not None:
            user, trust = req.user_info.username, current()
            if req.operation == "CREATE":
                problem = check_create(req.object, req.namespace, user, trust, queues, scheduler_name, rules)
            elif req.operation == "UPDATE" and req.old_object is not None:
                problem = check_update(req.old_object, req.object, user, trust, scheduler_name)
        if problem is None:
            return _review(req, {"allowed": True})
        return _review(req, {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": problem}})

    app = web.Application(client_max_size=MAX_REVIEW)
    app.router.add_post("/mutate", mutate_handler)
    app.router.add_post("/validate", validate_handler)
    return app
