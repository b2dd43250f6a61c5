"""Objects, the global revision counter, the event log and watchers (design/fake-apiserver.md §3–4).

Everything runs on one event loop and every write is synchronous, so events reach watchers in revision
order with no gaps. A stored object is never changed in place (every write stores a new one), so handlers
and watch streams serialise stored objects as they are, and only writers copy.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from . import validation
from .errors import STALE, ApiError, conflict, not_found
from .selectors import FieldGetter, Selector, field_getters

MICROTIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


@dataclass(slots=True, frozen=True)
class Resource:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    fields: tuple[str, ...] = ("metadata.name", "metadata.namespace")
    subresources: tuple[str, ...] = ()
    generation: bool = False  # tracks metadata.generation (spec changes)
    short_names: tuple[str, ...] = ()  # discovery's shortNames, as kubectl resolves `get pdb`
    custom: bool = False  # served from a CustomResourceDefinition (no strategic merge, PUT needs a version)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def getters(self) -> dict[str, FieldGetter]:
        return field_getters(self.fields)


RESOURCES = [
    Resource(
        "",
        "v1",
        "Pod",
        "pods",
        True,
        ("metadata.name", "metadata.namespace", "spec.nodeName", "spec.schedulerName", "status.phase"),
        ("status", "binding", "eviction"),
        short_names=("po",),
    ),
    Resource(
        "", "v1", "Node", "nodes", False, ("metadata.name", "spec.unschedulable"), ("status",), short_names=("no",)
    ),
    Resource("", "v1", "Namespace", "namespaces", False, ("metadata.name",), short_names=("ns",)),
    Resource("", "v1", "Event", "events", True, short_names=("ev",)),
    Resource("events.k8s.io", "v1", "Event", "events", True, short_names=("ev",)),
    Resource("coordination.k8s.io", "v1", "Lease", "leases", True),
    Resource(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        True,
        subresources=("status",),
        generation=True,
        short_names=("pdb",),
    ),
    Resource(
        "fairgpu.io", "v1alpha1", "Queue", "queues", False, subresources=("status",), generation=True, custom=True
    ),
    Resource("", "v1", "ServiceAccount", "serviceaccounts", True, short_names=("sa",)),
    Resource("", "v1", "ConfigMap", "configmaps", True, short_names=("cm",)),
    Resource("batch", "v1", "Job", "jobs", True, subresources=("status",), generation=True),
    Resource("batch", "v1", "CronJob", "cronjobs", True, subresources=("status",), generation=True),
    Resource("apps", "v1", "Deployment", "deployments", True, subresources=("status",), generation=True),
    # Workload kinds of operators fairgpu's admission covers, served as if their CRDs were installed (a real
    # API server serves any installed CRD; the fake, a fixed list): without a schema, objects are kept whole.
    *(
        Resource(group, version, kind, plural, True, subresources=("status",), generation=True, custom=True)
        for group, version, kind, plural in (
            ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
            ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
            ("ray.io", "v1", "RayJob", "rayjobs"),
            ("ray.io", "v1", "RayCluster", "rayclusters"),
        )
    ),
    *(
        Resource("rbac.authorization.k8s.io", "v1", kind, plural, namespaced)
        for kind, plural, namespaced in (
            ("Role", "roles", True),
            ("ClusterRole", "clusterroles", False),
            ("RoleBinding", "rolebindings", True),
            ("ClusterRoleBinding", "clusterrolebindings", False),
        )
    ),
    *(
        Resource("admissionregistration.k8s.io", "v1", kind, plural, False, generation=True)
        for kind, plural in (
            ("MutatingWebhookConfiguration", "mutatingwebhookconfigurations"),
            ("ValidatingWebhookConfiguration", "validatingwebhookconfigurations"),
            ("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
            ("ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings"),
        )
    ),
    Resource(
        "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False, generation=True
    ),
    # Reviews are never stored: a create answers the question (server.py).
    Resource("authentication.k8s.io", "v1", "TokenReview", "tokenreviews", False),
    Resource("authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", False),
]
BY_KIND = {r.kind: r for r in RESOURCES if r.group != "events.k8s.io"}
NAMESPACES = BY_KIND["Namespace"]
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")  # what every cluster has


@dataclass(slots=True)
class LogEntry:
    rev: int
    resource: Resource
    type: str
    obj: dict
    prev: dict | None  # the object before this write (None for a create)


@dataclass(slots=True)
class Watcher:
    resource: Resource
    namespace: str | None
    selector: Selector
    bookmarks: bool
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    sent_rev: int = 0

    def offer(self, entry: LogEntry) -> None:
        """Queue what this watcher sees of one write, with the apiserver's selector transitions."""
        if entry.resource != self.resource:
            return
        ns = entry.obj["metadata"].get("namespace")
        if self.namespace is not None and ns != self.namespace:
            return
        now = entry.type != "DELETED" and self.selector.matches(entry.obj)
        before = entry.prev is not None and self.selector.matches(entry.prev)
        if entry.type == "DELETED":
            now, before = False, self.selector.matches(entry.obj)
        if now and not before:
            self.push("ADDED", entry.obj)
        elif now and before:
            self.push("MODIFIED", entry.obj)
        elif before:
            gone = clone(entry.prev if entry.type != "DELETED" else entry.obj)
            gone["metadata"]["resourceVersion"] = str(entry.rev)
            self.push("DELETED", gone)

    def push(self, kind: str, obj: dict) -> None:
        self.sent_rev = max(self.sent_rev, int(obj["metadata"]["resourceVersion"]))
        self.queue.put_nowait({"type": kind, "object": obj})

    def close(self, error: dict | None = None) -> None:
        self.queue.put_nowait(error if error is not None else None)


class Store:
    def __init__(self, window: int = 100_000) -> None:
        self.rev = 1
        self.objects: dict[tuple[str, str, str, str], dict] = {}  # (group, plural, ns, name)
        self.by_type: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}  # (group, plural) → (ns, name) → obj
        self.log: deque[LogEntry] = deque(maxlen=window)
        self.compacted = 0  # watches/lists from below this revision get 410
        self.watchers: list[Watcher] = []
        self.frozen: list[Watcher] = []  # streams still open that receive nothing (test control)
        self.clock_offset = timedelta()
        self.clock: Callable[[], float] | None = None  # Unix seconds; a test's scaled clock (default: real time)
        for ns in SYSTEM_NAMESPACES:
            self.create(NAMESPACES, "", {"metadata": {"name": ns}})

    # -- time ---------------------------------------------------------------------------------------
    def now(self) -> datetime:
        base = datetime.now(UTC) if self.clock is None else datetime.fromtimestamp(self.clock(), UTC)
        return base + self.clock_offset

    def timestamp(self, later: float = 0.0) -> str:
        return (self.now() + timedelta(seconds=later)).strftime("%Y-%m-%dT%H:%M:%SZ")

    # -- reads --------------------------------------------------------------------------------------
    def get(self, res: Resource, ns: str, name: str) -> dict:
        obj = self.objects.get((res.group, res.plural, ns, name))
        if obj is None:
            raise not_found(_what(res), name)
        return obj

    def list(self, res: Resource, ns: str | None, selector: Selector) -> list[dict]:
        of_type = self.by_type.get((res.group, res.plural), {})
        return [obj for (ons, _), obj in sorted(of_type.items()) if (ns is None or ons == ns) and selector.matches(obj)]

    def list_all(self, res: Resource) -> list[dict]:
        return list(self.by_type.get((res.group, res.plural), {}).values())

    def check_rv(self, rv: str | None) -> None:
        if rv and rv != "0" and int(rv) < self.compacted:
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self.compacted})")

    # -- writes -------------------------------------------------------------------------------------
    def _write(self, res: Resource, kind: str, obj: dict, prev: dict | None) -> dict:
        self.rev += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rev)
        key = (res.group, res.plural, meta.get("namespace", ""), meta["name"])
        of_type = self.by_type.setdefault(key[:2], {})
        if kind == "DELETED":
            self.objects.pop(key, None)
            of_type.pop(key[2:], None)
        else:
            self.objects[key] = obj
            of_type[key[2:]] = obj
        entry = LogEntry(self.rev, res, kind, obj, prev)
        if len(self.log) == self.log.maxlen:
            self.compacted = self.log[0].rev
        self.log.append(entry)
        for w in self.watchers:
            w.offer(entry)
        return obj

    def crd_schema(self, res: Resource) -> dict | None:
        """The openAPIV3Schema of a custom resource's version, from its stored CRD (None without one)."""
        crd = self.objects.get(("apiextensions.k8s.io", "customresourcedefinitions", "", f"{res.plural}.{res.group}"))
        for v in ((crd or {}).get("spec") or {}).get("versions") or []:
            if v.get("name") == res.version:
                return (v.get("schema") or {}).get("openAPIV3Schema")
        return None

    def _structural(self, res: Resource, obj: dict) -> dict:
        schema = self.crd_schema(res) if res.custom else None
        if schema is None:
            return obj
        errs = validation.Invalid()
        out = validation.structural(obj, schema, "", errs)
        errs.raise_for(res.kind, (obj.get("metadata") or {}).get("name", ""), res.group)
        return out  # type: ignore[return-value]

    def create(self, res: Resource, ns: str, obj: dict) -> dict:
        obj = self._structural(res, obj)
        validate(res, obj)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name")
        if not name and meta.get("generateName"):
            name = meta["generateName"] + uuid.uuid4().hex[:5]
            meta["name"] = name
        if not name:
            raise ApiError(
                422, "Invalid", f"{res.kind} is invalid: metadata.name: Required value", _cause("metadata.name")
            )
        if res.namespaced:
            if meta.get("namespace", ns) != ns:
                raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the request")
            if ("", "namespaces", "", ns) not in self.objects:
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
            meta["namespace"] = ns
        else:  # BeforeCreate clears it for cluster-scoped kinds (kustomize sets it on kinds it does not know)
            meta.pop("namespace", None)
        if (res.group, res.plural, ns if res.namespaced else "", name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{_what(res)} "{name}" already exists', {"name": name})
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self.timestamp()
        if res.generation:
            meta["generation"] = 1
        default(res, obj)
        return self._write(res, "ADDED", obj, None)

    def update(
        self, res: Resource, ns: str, name: str, new: dict, subresource: str = "", strict_rv: bool = True
    ) -> dict:
        """Replace an object (PUT, or the result of a PATCH). A resourceVersion in `new` must be current."""
        old = self.get(res, ns, name)
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        rv = meta.get("resourceVersion")
        if strict_rv and rv and rv != old["metadata"]["resourceVersion"]:
            raise conflict(_what(res), name, STALE)
        uid = meta.get("uid")
        if uid and uid != old["metadata"].get("uid"):  # the registry's UID precondition on update and patch
            why = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {old['metadata'].get('uid')}"
            raise conflict(_what(res), name, why)
        if "status" in res.subresources:
            if subresource == "status":  # the status subresource changes status only
                new = {**clone(old), "status": new.get("status", {})}
            else:  # the main resource ignores status
                new["status"] = clone(old.get("status", {}))
        for k in (
            "uid",
            "creationTimestamp",
            "namespace",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ):
            if k in old["metadata"]:
                new["metadata"][k] = old["metadata"][k]
            else:
                new["metadata"].pop(k, None)
        new["metadata"]["name"] = name
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        if res.plural == "pods" and new.get("spec") != old.get("spec"):
            _check_pod_spec_update(old["spec"], new.get("spec", {}), name)
        new = self._structural(res, new)
        if res.generation and new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        validate(res, new)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return old  # a no-op write keeps the revision, like the apiserver
        return self._write(res, "MODIFIED", new, old)

    def delete(self, res: Resource, ns: str, name: str, grace: int | None = None) -> dict:
        """Without a kubelet the fake deletes at once, unless the caller gives a bound, running pod a grace
        period: then, as the apiserver does, it only marks the pod (deletionTimestamp, MODIFIED) and whoever
        plays the kubelet deletes it again with grace 0 once its containers are gone. A second graceful
        delete may only shorten the grace."""
        old = self.get(res, ns, name)
        if res.plural == "pods" and grace and old["spec"].get("nodeName") and not _terminal(old):
            meta = old["metadata"]
            if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds", 0) <= grace:
                return old
            new = clone(old)
            new["metadata"]["deletionTimestamp"] = self.timestamp(grace)
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            return self._write(res, "MODIFIED", new, old)
        if old["metadata"].get("finalizers"):
            new = clone(old)
            new["metadata"].setdefault("deletionTimestamp", self.timestamp())
            new["metadata"].setdefault("deletionGracePeriodSeconds", 0)
            return self._write(res, "MODIFIED", new, old)
        return self._write(res, "DELETED", clone(old), old)

    def mutate(self, res: Resource, ns: str, name: str, change: Callable[[dict], None]) -> dict:
        """A server-side write (binding): change a copy of the current object and store it."""
        old = self.get(res, ns, name)
        new = clone(old)
        change(new)
        return self._write(res, "MODIFIED", new, old)

    # -- watch --------------------------------------------------------------------------------------
    def watch(self, res: Resource, ns: str | None, selector: Selector, rv: str | None, bookmarks: bool) -> Watcher:
        w = Watcher(res, ns, selector, bookmarks)
        if rv and rv != "0":
            start = int(rv)
            if start < self.compacted:
                w.close(expired(start, self.compacted))
                return w
            for entry in self.log:
                if entry.rev > start:
                    w.offer(entry)
        else:
            for obj in self.list(res, ns, selector):
                w.push("ADDED", obj)
        self.watchers.append(w)
        return w

    def unwatch(self, w: Watcher) -> None:
        for group in (self.watchers, self.frozen):
            if w in group:
                group.remove(w)

    def compact(self) -> None:
        self.compacted = self.rev
        self.log.clear()


def default(res: Resource, obj: dict) -> None:
    """The defaults the apiserver applies when it decodes a new object (before admission sees it)."""
    if res.plural == "namespaces":  # the apiserver labels every namespace with its name
        meta = obj.setdefault("metadata", {})
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta.get("name", "")
    if res.plural == "pods" and isinstance(obj.get("spec"), dict):
        obj.setdefault("status", {}).setdefault("phase", "Pending")
        obj["spec"].setdefault("schedulerName", "default-scheduler")


def clone(obj: dict) -> dict:
    """A private copy of a JSON object to change (a JSON round trip: several times faster than deepcopy)."""
    return json.loads(json.dumps(obj))


def expired(rv: int, compacted: int) -> dict:
    return {
        "type": "ERROR",
        "object": ApiError(410, "Expired", f"too old resource version: {rv} ({compacted})").status(),
    }


def _terminal(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _what(res: Resource) -> str:
    return f"{res.plural}.{res.group}" if res.group else res.plural


def _cause(path: str, message: str = "Required value") -> dict:
    return {"causes": [{"reason": "FieldValueRequired", "message": message, "field": path}]}


def _invalid(res: Resource, name: str, path: str, message: str) -> ApiError:
    return ApiError(
        422,
        "Invalid",
        f'{res.kind} "{name}" is invalid: {path}: {message}',
        {
            "name": name,
            "kind": res.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": message, "field": path}],
        },
    )


def _check_pod_spec_update(old: dict, new: dict, name: str) -> None:
    """Pod specs are immutable apart from images, activeDeadlineSeconds and removing scheduling gates."""
    loose = ("containers", "initContainers", "activeDeadlineSeconds", "schedulingGates", "tolerations")
    strip = {k: v for k, v in old.items() if k not in loose}
    if strip != {k: v for k, v in new.items() if k not in loose} or len(new.get("schedulingGates") or []) > len(
        old.get("schedulingGates") or []
    ):
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other than '
            "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to "
            "existing tolerations) or `spec.schedulingGates`",
        )


def validate(res: Resource, obj: dict) -> None:
    """The few validations the scheduler's writes can trip: they make tests fail where a real server would."""
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    if not isinstance(meta.get("annotations", {}), dict) or any(
        not isinstance(v, str) for v in (meta.get("annotations") or {}).values()
    ):
        raise _invalid(res, name, "metadata.annotations", "annotation values must be strings")
    if res.plural == "pods" and not (obj.get("spec") or {}).get("containers"):
        raise _invalid(res, name, "spec.containers", "Required value")
    if res.plural == "pods":
        validation.quantities(obj)
    errs = validation.Invalid()
    validation.metadata(res.kind, obj, errs)
    errs.raise_for(res.kind, name, res.group)
    if res.plural == "leases":
        spec = obj.get("spec") or {}
        d = spec.get("leaseDurationSeconds")
        if d is not None and (not isinstance(d, int) or d <= 0):
            raise _invalid(res, name, "spec.leaseDurationSeconds", "must be greater than 0")
        for k in ("acquireTime", "renewTime"):
            _microtime(spec.get(k), f"spec.{k}")
    if res.kind == "Event":
        _microtime(obj.get("eventTime"), "eventTime")
    if res.plural == "poddisruptionbudgets":
        spec = obj.get("spec") or {}
        if "minAvailable" in spec and "maxUnavailable" in spec:
            raise _invalid(res, name, "spec", "minAvailable and maxUnavailable cannot be both set")


def _microtime(value: object, path: str) -> None:
    if value is not None and (not isinstance(value, str) or not MICROTIME.match(value)):
        raise ApiError(
            400,
            "BadRequest",
            f'{path}: parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00": cannot parse as ".000000"',
        )
