"""Admission webhook (admission.k8s.io/v1): GPU pods cannot bypass fairgpu, cannot forge their user, and
cannot name another tenant's queue.

Mutating: GPU pods get `schedulerName: fairgpu`, the `fairgpu.io/user` label from the request's userInfo
(overwriting any the pod carries), and HAMi's defaults written out (gpu alone → gpucores 100; gpucores or
gpumem alone → gpu 1), since HAMi's own webhook skips pods that name another scheduler.
Validating: rejects GPU requests fairgpu could never honour and queues the namespace may not use.
"""

from __future__ import annotations

import base64
import json
import re
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fairgpu import resources as r
from fairgpu.errors import RequestError
from fairgpu.hamiconfig import DEFAULT as DEFAULT_HAMI
from fairgpu.hamiconfig import HamiConfig
from fairgpu.k8s.translate import QUEUE_LABEL, USER_LABEL, pod_info
from fairgpu.model import gpu_request
from fairgpu.model.pod import webhook_defaults

GPU_RESOURCES = (r.GPU, r.GPUCORES, r.GPUMEM, r.GPUMEM_PCT)
# queue name → namespaces allowed to use it (empty: any); None when the queue does not exist
QueueLookup = Callable[[str], tuple[str, ...] | None]


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


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    api_version: str = Field(alias="apiVersion")
    kind: str
    request: AdmissionRequest


def label_value(user: str) -> str:
    """A username as a label value: [A-Za-z0-9_.-], at most 63 characters, alphanumeric at both ends
    (`system:serviceaccount:ml:runner` → `system.serviceaccount.ml.runner`; `a@b.com` → `a_b.com`)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", lambda m: "." if m.group() == ":" else "_", user)[:63]
    return value.strip("_.-")


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


def mutate(pod: dict, user: str, scheduler_name: str, config: HamiConfig = DEFAULT_HAMI) -> list[dict]:
    """JSON patch operations for a pod; none for a pod that asks for no GPU."""
    rules = config.rules()
    if not wants_gpu(pod, rules.names):
        return []
    ops: list[dict] = []
    if (pod.get("spec") or {}).get("schedulerName") != scheduler_name:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    if "labels" not in (pod.get("metadata") or {}) or pod["metadata"]["labels"] is None:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
    ops.append({"op": "add", "path": f"/metadata/labels/{_escape(USER_LABEL)}", "value": label_value(user)})
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
    return ops + hami_injections(pod, config)


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
    gpu = any(
        gpu_request(_container_resources(c), rules) is not None
        for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or [])
    )
    if gpu and config.runtime_class_name and spec.get("runtimeClassName") is None:
        ops.append({"op": "add", "path": "/spec/runtimeClassName", "value": config.runtime_class_name})
    return ops


def _container_resources(c: dict) -> dict:
    res = c.get("resources") or {}
    return {**(res.get("requests") or {}), **(res.get("limits") or {})}


def validate(pod: dict, namespace: str, queues: QueueLookup) -> str | None:
    """Why the pod must be rejected; None to admit it."""
    pod = {**pod, "metadata": {"name": "pending-name", **(pod.get("metadata") or {}), "namespace": namespace}}
    try:
        problem = pod_info(pod).problem
        if problem is not None:
            return problem
        for c in _containers(pod):  # HAMi's webhook refuses what its scheduler would clamp
            pct = _container_resources(c).get(r.GPUMEM_PCT)
            if pct is not None and not 0 <= r.parse_quantity(pct) <= 100:
                return f"{r.GPUMEM_PCT}: {pct} must be between 0 and 100 (container {c.get('name')})"
    except RequestError as err:
        return str(err)
    except ValueError as err:
        return str(err)
    queue = ((pod.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
    if queue is not None and wants_gpu(pod):
        allowed = queues(queue)
        if allowed is None:
            return f"metadata.labels[{QUEUE_LABEL}]: queue {queue!r} does not exist"
        if allowed and namespace not in allowed:
            return f"metadata.labels[{QUEUE_LABEL}]: namespace {namespace} may not use queue {queue!r}"
    return None


def _review(req: AdmissionRequest, response: dict) -> web.Response:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": req.uid, **response}}
    return web.json_response(body)


async def _parse(request: web.Request) -> AdmissionReview | web.Response:
    try:
        return AdmissionReview.model_validate(await request.json())
    except (ValidationError, ValueError) as err:
        return web.json_response({"error": f"not an AdmissionReview: {err}"}, status=400)


def webhook_app(
    queues: QueueLookup, scheduler_name: str = "fairgpu", config: HamiConfig = DEFAULT_HAMI
) -> web.Application:
    async def mutate_handler(request: web.Request) -> web.Response:
        review = await _parse(request)
        if isinstance(review, web.Response):
            return review
        req = review.request
        if req.kind.get("kind") != "Pod" or req.object is None or req.operation != "CREATE":
            return _review(req, {"allowed": True})
        ops = mutate(req.object, req.user_info.username, scheduler_name, config)
        if not ops:
            return _review(req, {"allowed": True})
        patch = base64.b64encode(json.dumps(ops).encode()).decode()
        return _review(req, {"allowed": True, "patchType": "JSONPatch", "patch": patch})

    async def validate_handler(request: web.Request) -> web.Response:
        review = await _parse(request)
        if isinstance(review, web.Response):
            return review
        req = review.request
        if req.kind.get("kind") != "Pod" or req.object is None or req.operation not in ("CREATE", "UPDATE"):
            return _review(req, {"allowed": True})
        problem = validate(req.object, req.namespace, queues)
        if problem is None:
            return _review(req, {"allowed": True})
        return _review(req, {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": problem}})

    app = web.Application()
    app.router.add_post("/mutate", mutate_handler)
    app.router.add_post("/validate", validate_handler)
    return app


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx
