"""The wire-level fake kube-apiserver (design/fake-apiserver.md): aiohttp on 127.0.0.1, JSON only.

Test controls live under /_fake/ and answer only requests carrying the header `X-Fake-Control: yes`, so a
production client can never reach them by accident.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field

from aiohttp import web

from . import openapi, patches
from .admission import Admission, Request
from .auth import Attributes, Authenticator, User, allowed, service_account
from .errors import ApiError, conflict, not_found, success
from .faults import REASONS, Faults
from .selectors import Selector, label_selector, parse_fields, parse_labels
from .store import NAMESPACES, RESOURCES, Resource, Store, clone, default

JSON = "application/json"
CONTROL_HEADER = "X-Fake-Control"
USER = web.RequestKey("user", User)
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def go_bool(query: dict, key: str) -> bool:
    raw = query.get(key)
    if raw is None or raw == "":
        return False
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ApiError(400, "BadRequest", f'strconv.ParseBool: parsing "{raw}": invalid syntax ({key})')


def respond(body: object, status: int = 200) -> web.Response:
    # Content-Type exactly application/json, no charset (design §1).
    return web.Response(body=json.dumps(body).encode(), status=status, headers={"Content-Type": JSON})


def respond_error(err: ApiError) -> web.Response:
    resp = respond(err.status(), err.code)
    retry = (err.details or {}).get("retryAfterSeconds")
    if retry:  # as the apiserver does for a 429 that suggests when to come back
        resp.headers["Retry-After"] = str(retry)
    return resp


@dataclass(slots=True)
class Target:
    res: Resource
    ns: str | None
    name: str | None
    sub: str | None


@dataclass
class FakeState:
    store: Store = field(default_factory=Store)
    faults: Faults = field(default_factory=Faults)
    bindings: list[dict] = field(default_factory=list)  # every binding attempt and its answer
    evictions: list[dict] = field(default_factory=list)
    requests: int = 0
    credentials: set[str] = field(default_factory=set)  # Authorization headers seen (tests check clients send them)
    device_plugin: bool = False  # play HAMi's device plugin on every bind (test control)
    auth: Authenticator = field(default_factory=Authenticator)
    denied: list[dict] = field(default_factory=list)  # every 401 and 403, for tests to audit


_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}


def resolve(group: str, version: str, parts: list[str]) -> Target:
    ns = None
    if len(parts) >= 3 and parts[0] == "namespaces":
        ns, parts = parts[1], parts[2:]
    if not parts or len(parts) > 3:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    res = _BY_PATH.get((group, version, parts[0]))
    if res is None or (ns is not None and not res.namespaced):
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    name = parts[1] if len(parts) > 1 else None
    sub = parts[2] if len(parts) > 2 else None
    if sub is not None and sub not in res.subresources:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return Target(res, ns if res.namespaced else None, name, sub)


class FakeApi:
    def __init__(self) -> None:
        self.state = FakeState()
        self.app = web.Application(client_max_size=64 << 20)
        self.app.router.add_route("*", "/_fake/{op}", self.control)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.streams: set[web.StreamResponse] = set()
        self.late_writes: set[asyncio.Task] = set()  # requests answered already, carried out later (faults.late)
        self.admission = Admission(self.state.store)

    @property
    def store(self) -> Store:
        return self.state.store

    # -- dispatch -----------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.state.requests += 1
        self.state.credentials.add(request.headers.get("Authorization", ""))
        try:
            request[USER] = self.state.auth.user(request.headers.get("Authorization"))
            late = self.state.faults.late(request)
            if late is not None:
                await request.read()  # kept for the handling that comes later
                task = asyncio.create_task(self._late(request, late.late))
                self.late_writes.add(task)
                task.add_done_callback(self.late_writes.discard)
                raise ApiError(late.code, REASONS.get(late.code, "InternalError"), f"injected fault {late.code} (late)")
            await self.state.faults.before(request)
            return self.state.faults.after(request, await self._route(request))
        except ApiError as err:
            if err.code in (401, 403):
                self.state.denied.append({"method": request.method, "path": request.path, "message": err.message})
            return respond_error(err)

    async def _late(self, request: web.Request, seconds: float) -> None:
        """Carry out a request answered already, as the apiserver's handler goes on after its timeout answered;
        its outcome reaches nobody."""
        await asyncio.sleep(seconds)
        with contextlib.suppress(ApiError):
            await self._route(request)

    def _authorize(self, request: web.Request, attrs: Attributes) -> User:
        user: User = request[USER]
        if not allowed(self.store, user, attrs):
            raise attrs.forbidden(user.username)
        return user

    async def _route(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        parts = [p for p in path.split("/") if p]
        if not _is_resource_path(parts):
            self._authorize(request, Attributes(request.method.lower(), path=request.path))
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok", content_type="text/plain")
        if path == "/version":
            return respond(
                {"major": "1", "minor": "32", "gitVersion": "v1.32.0-fairgpu-fake", "platform": "linux/amd64"}
            )
        if path == "/api":
            return respond({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/apis":
            return respond(self._groups())
        if path == "/openapi/v3":
            return respond(openapi.root())
        if path.startswith("/openapi/v3/"):
            doc = openapi.group_version(path[len("/openapi/v3/") :])
            if doc is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return respond(doc)
        if parts[:2] == ["api", "v1"]:
            if len(parts) == 2:
                return respond(self._resource_list("", "v1"))
            return await self._resource(request, resolve("", "v1", parts[2:]))
        if parts[:1] == ["apis"] and len(parts) >= 3:
            if len(parts) == 3:
                if not any(r.group == parts[1] and r.version == parts[2] for r in RESOURCES):
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return respond(self._resource_list(parts[1], parts[2]))
            return await self._resource(request, resolve(parts[1], parts[2], parts[3:]))
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _groups(self) -> dict:
        groups: dict[str, list[str]] = {}
        for r in RESOURCES:
            if r.group and r.version not in groups.get(r.group, ()):  # each version once, however many kinds
                groups.setdefault(r.group, []).append(r.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in groups.items()
            ],
        }

    def _resource_list(self, group: str, version: str) -> dict:
        out = []
        for r in RESOURCES:
            if r.group != group or r.version != version:
                continue
            verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
            out.append(
                {
                    "name": r.plural,
                    "singularName": r.kind.lower(),
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": verbs,
                    **({"shortNames": list(r.short_names)} if r.short_names else {}),
                }
            )
            for sub in r.subresources:
                kind = {"binding": "Binding", "eviction": "Eviction"}.get(sub, r.kind)
                sub_verbs = ["create"] if sub in ("binding", "eviction") else ["get", "patch", "update"]
                out.append(
                    {
                        "name": f"{r.plural}/{sub}",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": kind,
                        "verbs": sub_verbs,
                    }
                )
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}

    # -- resources ----------------------------------------------------------------------------------
    async def _resource(self, request: web.Request, t: Target) -> web.StreamResponse:
        q = request.query
        store = self.store
        m = request.method
        verb = _VERBS.get(m, m.lower())
        if m == "GET":
            verb = "get" if t.name is not None else ("watch" if go_bool(q, "watch") else "list")
        user = self._authorize(
            request, Attributes(verb, t.res.group, t.res.plural, t.sub or "", t.ns or "", t.name or "")
        )
        if t.res.plural in ("tokenreviews", "subjectaccessreviews"):
            if m != "POST" or t.name is not None:
                raise ApiError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            return respond(self._review(t.res, await _json(request)), 201)
        if t.sub in ("binding", "eviction"):
            if m != "POST":
                raise ApiError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            body = await _json(request)
            await self.admission.admit(Request("CREATE", t.res, t.sub, t.ns or "", t.name, body, None, user.info()))
            return self._bind(t, body) if t.sub == "binding" else self._evict(t, body)
        if t.name is None:
            selector = Selector(
                parse_labels(q.get("labelSelector")),
                parse_fields(q.get("fieldSelector"), t.res.getters, t.res.kind),
                t.res.getters,
            )
            if m == "GET" and go_bool(q, "watch"):
                return await self._watch(request, t, selector)
            if m == "GET":
                store.check_rv(q.get("resourceVersion"))
                items = store.list(t.res, t.ns, selector)
                return respond(
                    {
                        "kind": f"{t.res.kind}List",
                        "apiVersion": t.res.api_version,
                        "metadata": {"resourceVersion": str(store.rev)},
                        "items": items,
                    }
                )
            if m == "POST":
                if t.res.namespaced and t.ns is None:
                    raise ApiError(405, "MethodNotAllowed", "create needs a namespace in the path")
                body = await _json(request)
                if body.get("kind") not in (None, t.res.kind):
                    raise ApiError(400, "BadRequest", f"the body kind {body.get('kind')!r} is not {t.res.kind}")
                default(t.res, body)
                self._strict(request, t.res, body)
                name = (body.get("metadata") or {}).get("name", "")
                req = Request("CREATE", t.res, "", t.ns or "", name, body, None, user.info())
                body = await self.admission.admit(req) or body
                return respond(store.create(t.res, t.ns or "", body), 201)
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        ns = t.ns or ""
        if m == "GET":
            return respond(store.get(t.res, ns, t.name))
        if m == "PUT":
            body = await _json(request)
            if t.res.custom and not (body.get("metadata") or {}).get("resourceVersion"):
                raise ApiError(
                    422,
                    "Invalid",
                    f'{t.res.kind}.{t.res.group} "{t.name}" is invalid: metadata.resourceVersion: Invalid value: '
                    "0x0: must be specified for an update",
                    {
                        "name": t.name,
                        "group": t.res.group,
                        "kind": t.res.kind,
                        "causes": [
                            {
                                "reason": "FieldValueInvalid",
                                "message": "Invalid value: 0x0: must be specified for an update",
                                "field": "metadata.resourceVersion",
                            }
                        ],
                    },
                )
            self._strict(request, t.res, body)
            old = store.get(t.res, ns, t.name)
            body = await self.admission.admit(Request("UPDATE", t.res, t.sub or "", ns, t.name, body, old, user.info()))
            return respond(store.update(t.res, ns, t.name, body or {}, t.sub or ""))
        if m == "PATCH":
            media = request.headers.get("Content-Type", "")
            if t.res.custom and media.split(";")[0].strip() == patches.STRATEGIC:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types include: "
                    f"{patches.JSON_PATCH}, {patches.MERGE}, application/apply-patch+yaml",
                )
            raw = await request.read()
            # A resourceVersion carried in the patch is a precondition; otherwise the patch is unconditional,
            # and applied again to the newest object when a write lands while admission is asked (as the
            # apiserver's GuaranteedUpdate does).
            body_rv = _patch_rv(media, raw)
            for _ in range(5):
                current = clone(store.get(t.res, ns, t.name))
                patched = patches.apply(media, current, raw)
                self._strict(request, t.res, patched)
                if body_rv is None:
                    patched.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
                req = Request("UPDATE", t.res, t.sub or "", ns, t.name, patched, current, user.info())
                patched = await self.admission.admit(req) or patched
                try:
                    return respond(store.update(t.res, ns, t.name, patched, t.sub or ""))
                except ApiError as err:
                    if body_rv is not None or err.code != 409:
                        raise
            raise conflict(t.res.plural, t.name, "too many concurrent writes")
        if m == "DELETE":
            options = await _json(request) if request.can_read_body else {}
            raw = q.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
            gone = store.delete(t.res, ns, t.name, _grace(raw, t.res.plural == "pods"))
            if t.res.plural == "nodes":
                self._collect_pods_of(t.name)
            return respond(gone)
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def _strict(self, request: web.Request, res: Resource, obj: dict) -> None:
        """`?fieldValidation=Strict` (what kubectl sends once OpenAPI says the server can): unknown fields are
        a 400 instead of being dropped."""
        if request.query.get("fieldValidation") == "Strict":
            openapi.unknown_fields(res, obj, self.store.crd_schema(res) if res.custom else None)

    def _review(self, res: Resource, body: dict) -> dict:
        """TokenReview and SubjectAccessReview: answered from the fake's tokens and RBAC, never stored."""
        spec = body.get("spec") or {}
        out = {"apiVersion": res.api_version, "kind": res.kind, "metadata": {"creationTimestamp": None}, "spec": spec}
        if res.kind == "TokenReview":
            user = self.state.auth.review(spec.get("token", ""))
            out["status"] = {"authenticated": True, "user": user.info()} if user else {"authenticated": False}
            return out
        subject = User(spec.get("user", ""), tuple(spec.get("groups") or ()), spec.get("uid", ""))
        attrs = spec.get("resourceAttributes")
        if attrs:
            a = Attributes(
                attrs.get("verb", ""),
                attrs.get("group", ""),
                attrs.get("resource", ""),
                attrs.get("subresource", ""),
                attrs.get("namespace", ""),
                attrs.get("name", ""),
            )
        else:
            nra = spec.get("nonResourceAttributes") or {}
            a = Attributes(nra.get("verb", ""), path=nra.get("path", ""))
        ok = allowed(self.store, subject, a)
        out["status"] = {"allowed": ok, **({} if ok else {"reason": "no RBAC rule allows it"})}
        return out

    def _collect_pods_of(self, node: str) -> None:
        """The pod GC controller: pods bound to a node that no longer exists are deleted at once."""
        pods = _BY_PATH[("", "v1", "pods")]
        for pod in self.store.list(pods, None, _ALL):
            if pod["spec"].get("nodeName") == node:
                self.store.delete(pods, pod["metadata"]["namespace"], pod["metadata"]["name"], 0)

    def _bind(self, t: Target, body: dict) -> web.Response:
        """BindingREST.Create (design §5): checks in the apiserver's order; answers a Status, not a Binding."""
        record = {"namespace": t.ns, "name": t.name, "node": (body.get("target") or {}).get("name")}
        try:
            # A missing kind is defaulted from the endpoint, as the apiserver's decoder does.
            if body.get("kind", "Binding") != "Binding" or not isinstance(body.get("metadata"), dict):
                raise ApiError(400, "BadRequest", "the body of the request is not a Binding")
            meta = body["metadata"]
            if meta.get("name") != t.name:
                raise ApiError(400, "BadRequest", "name in URL does not match name in Binding object")
            target = body.get("target") or {}
            if not target.get("name"):
                raise ApiError(500, "InternalError", "target.name: Required value")
            if target.get("kind") not in (None, "", "Node"):
                raise ApiError(500, "InternalError", 'target.kind: Unsupported value: "{}"'.format(target["kind"]))
            pod = self.store.get(t.res, t.ns or "", t.name)
            pmeta = pod["metadata"]
            if meta.get("uid") and meta["uid"] != pmeta["uid"]:
                raise conflict(
                    "pods",
                    t.name,
                    f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {pmeta['uid']}",
                )
            if meta.get("resourceVersion") and meta["resourceVersion"] != pmeta["resourceVersion"]:
                raise conflict(
                    "pods",
                    t.name,
                    "Precondition failed: ResourceVersion in precondition: "
                    f"{meta['resourceVersion']}, ResourceVersion in object meta: {pmeta['resourceVersion']}",
                )
            if pmeta.get("deletionTimestamp"):
                raise conflict("pods", t.name, f"pod {t.name} is being deleted, cannot be assigned to a host")
            if pod["spec"].get("nodeName"):
                raise conflict("pods", t.name, f'pod {t.name} is already assigned to node "{pod["spec"]["nodeName"]}"')
            if pod["spec"].get("schedulingGates"):
                raise conflict("pods", t.name, f"pod {t.name} has non-empty .spec.schedulingGates")

            def assign(p: dict) -> None:
                p["spec"]["nodeName"] = target["name"]
                if meta.get("annotations"):
                    p["metadata"].setdefault("annotations", {}).update(meta["annotations"])
                status = p.setdefault("status", {})
                conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
                conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": self.store.timestamp()})
                status["conditions"] = conds
                status.pop("nominatedNodeName", None)

            bound = self.store.mutate(t.res, t.ns or "", t.name, assign)
            record["code"] = 201
            if self.state.device_plugin:
                self._allocate(t.res, bound, target["name"])
            return respond(success(201), 201)
        except ApiError as err:
            record["code"] = err.code
            record["message"] = err.message
            raise
        finally:
            self.state.bindings.append(record)

    def _allocate(self, res: Resource, pod: dict, node: str) -> None:
        """HAMi's device plugin and the kubelet, as a test control: consume the allocation (bind-phase
        success, to-allocate erased), release the node lock the pod holds, and start the pod."""
        meta = pod["metadata"]
        ann = meta.get("annotations") or {}
        if ann.get("hami.io/bind-phase") == "allocating":

            def consume(p: dict) -> None:
                a = p["metadata"]["annotations"]
                a["hami.io/vgpu-devices-to-allocate"] = ";" * a.get("hami.io/vgpu-devices-to-allocate", "").count(";")
                a["hami.io/bind-phase"] = "success"
                p["status"]["phase"] = "Running"

            self.store.mutate(res, meta["namespace"], meta["name"], consume)
            nodes = _BY_PATH[("", "v1", "nodes")]
            with contextlib.suppress(ApiError):
                lock = (self.store.get(nodes, "", node)["metadata"].get("annotations") or {}).get("hami.io/mutex.lock")
                if lock and lock.endswith(f",{meta['namespace']},{meta['name']}"):
                    self.store.mutate(nodes, "", node, lambda n: n["metadata"]["annotations"].pop("hami.io/mutex.lock"))

    def _evict(self, t: Target, body: dict) -> web.Response:
        """EvictionREST.Create (pkg/registry/core/pod/storage/eviction.go): a pod that is pending, finished or
        already being deleted goes without a look at budgets; otherwise the one PodDisruptionBudget whose
        selector matches it must allow a disruption, which the eviction then uses up. Answers a Status."""
        record: dict = {"namespace": t.ns, "name": t.name}
        try:
            if body.get("kind", "Eviction") != "Eviction" or body.get("apiVersion", "policy/v1") not in (
                "policy/v1",
                "policy/v1beta1",
            ):
                raise ApiError(400, "BadRequest", "the body of the request is not an Eviction")
            if (body.get("metadata") or {}).get("name") != t.name:
                raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
            options = body.get("deleteOptions") or {}
            if not isinstance(options, dict):
                raise ApiError(400, "BadRequest", "deleteOptions must be an object")
            grace = _grace(options.get("gracePeriodSeconds"), pod=True)
            record["gracePeriodSeconds"] = grace
            pod = self.store.get(t.res, t.ns or "", t.name)
            uid = (options.get("preconditions") or {}).get("uid")
            if uid and uid != pod["metadata"]["uid"]:
                raise conflict(
                    "pods",
                    t.name,
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {pod['metadata']['uid']}",
                )
            if not _ignores_budgets(pod):
                self._use_budget(pod)
            self.store.delete(t.res, t.ns or "", t.name, grace)
            record["code"] = 201
            return respond(success(201), 201)
        except ApiError as err:
            record["code"] = err.code
            raise
        finally:
            self.state.evictions.append(record)

    def _use_budget(self, pod: dict) -> None:
        meta = pod["metadata"]
        budgets = []
        for pdb in self.store.list(_BY_PATH[("policy", "v1", "poddisruptionbudgets")], meta["namespace"], _ALL):
            reqs = label_selector((pdb.get("spec") or {}).get("selector"))
            # An invalid selector matches nothing; so does an empty one, here (unlike the disruption controller).
            if reqs and all(r.matches(meta.get("labels") or {}) for r in reqs):
                budgets.append(pdb)
        if not budgets:
            return
        if len(budgets) > 1:
            raise ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            )
        pdb = budgets[0]
        name, status = pdb["metadata"]["name"], pdb.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        if not ready:  # an unhealthy pod does not count towards the budget (unhealthyPodEvictionPolicy)
            healthy, desired = status.get("currentHealthy", 0), status.get("desiredHealthy", 0)
            if (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == "AlwaysAllow" or healthy >= desired > 0:
                return
        if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
            raise _budget_refusal(f"The disruption budget {name} is still being processed by the server.", 10)
        allowed = status.get("disruptionsAllowed", 0)
        if allowed < 0:
            raise ApiError(
                403,
                "Forbidden",
                f'poddisruptionbudgets.policy "{name}" is forbidden: pdb disruptions allowed is negative',
            )
        if allowed == 0:
            raise _budget_refusal(
                f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods and has "
                f"{status.get('currentHealthy', 0)} currently",
                0,
            )

        def disrupt(p: dict) -> None:
            st = p.setdefault("status", {})
            st["disruptionsAllowed"] = allowed - 1
            st.setdefault("disruptedPods", {})[meta["name"]] = self.store.timestamp()

        self.store.mutate(_BY_PATH[("policy", "v1", "poddisruptionbudgets")], meta["namespace"], name, disrupt)

    async def _watch(self, request: web.Request, t: Target, selector: Selector) -> web.StreamResponse:
        q = request.query
        bookmarks = go_bool(q, "allowWatchBookmarks")
        initial = go_bool(q, "sendInitialEvents")
        rv = q.get("resourceVersion")
        timeout = float(q.get("timeoutSeconds") or 1800)
        w = self.store.watch(t.res, t.ns, selector, None if initial else rv, bookmarks)
        if initial:
            w.push("BOOKMARK", self._bookmark(t.res, {"k8s.io/initial-events-end": "true"}))
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        self.streams.add(resp)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(left):
                        ev = await w.queue.get()
                except TimeoutError:
                    break
                if ev is None:
                    break
                if ev["type"] == "BOOKMARK" and not (bookmarks or initial):
                    continue
                await resp.write(json.dumps(ev).encode() + b"\n")
                if ev["type"] == "ERROR":
                    break
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.unwatch(w)
            self.streams.discard(resp)
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp

    def _bookmark(self, res: Resource, annotations: dict | None = None) -> dict:
        meta: dict = {"resourceVersion": str(self.store.rev)}
        if annotations:
            meta["annotations"] = annotations
        return {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta}

    # -- test controls ------------------------------------------------------------------------------
    async def control(self, request: web.Request) -> web.Response:
        if request.headers.get(CONTROL_HEADER) != "yes":
            return respond(not_found("", request.path).status(), 404)
        op = request.match_info["op"]
        body = await request.json() if request.can_read_body else {}
        store, st = self.store, self.state
        if op == "compact":  # every watch or list from an older revision now gets 410
            store.compact()
        elif op == "freeze-watches":  # open streams stay open but get nothing more: clients miss events
            store.frozen.extend(store.watchers)
            store.watchers.clear()
        elif op == "expire-watches":  # in-stream 410 on every open watch
            for w in store.watchers + store.frozen:
                w.close(
                    {
                        "type": "ERROR",
                        "object": ApiError(
                            410, "Expired", f"too old resource version: {w.sent_rev} ({store.rev})"
                        ).status(),
                    }
                )
        elif op == "drop-watches":  # close every stream cleanly
            for w in store.watchers + store.frozen:
                w.close()
            store.frozen.clear()
        elif op == "bookmark":
            for w in store.watchers:
                if w.bookmarks:
                    w.push("BOOKMARK", self._bookmark(w.resource))
        elif op == "token":  # a bearer token for a user, or for a service account
            if "service_account" in body:
                ns, name = body["service_account"].split("/")
                st.auth.tokens[body["token"]] = service_account(ns, name)
            else:
                groups = (*(body.get("groups") or ()), "system:authenticated")
                st.auth.tokens[body["token"]] = User(body["username"], groups, body.get("uid", ""))
        elif op == "service":  # where a Service that webhooks name answers (no cluster DNS here)
            self.admission.services[(body["namespace"], body["name"])] = body["address"]
        elif op == "device-plugin":
            st.device_plugin = bool(body.get("enabled", True))
        elif op == "clock":
            from datetime import timedelta

            store.clock_offset += timedelta(seconds=float(body["advance_seconds"]))
        elif op == "finish-deletion":
            res = _BY_PATH[("", "v1", "pods")]
            obj = store.get(res, body["namespace"], body["name"])
            store._write(res, "DELETED", clone(obj), obj)
        elif op == "state":
            return respond(
                {
                    "rev": store.rev,
                    "faults": [asdict(f) for f in st.faults.faults],
                    "injected": st.faults.injected,
                    "bindings": st.bindings,
                    "evictions": st.evictions,
                    "watchers": len(store.watchers),
                    "requests": st.requests,
                }
            )
        elif op == "requests":
            return respond({"requests": st.faults.log})
        elif not st.faults.control(op, body):
            return respond(not_found("control", op).status(), 404)
        return respond({"ok": True, "rev": store.rev})


_ALL = Selector([], [], {})
_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _is_resource_path(parts: list[str]) -> bool:
    """/api/v1/... and /apis/GROUP/VERSION/... past discovery: what RBAC knows as resource requests."""
    return (parts[:2] == ["api", "v1"] and len(parts) > 2) or (parts[:1] == ["apis"] and len(parts) > 3)


def _ignores_budgets(pod: dict) -> bool:
    """Pending, finished or already terminating pods are evicted without consulting any budget."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Pending", "Succeeded", "Failed") or bool(pod["metadata"].get("deletionTimestamp"))


def _budget_refusal(cause: str, retry_after: int) -> ApiError:
    details: dict = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return ApiError(
        429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.", details
    )


def _grace(raw: object, pod: bool) -> int | None:
    """DeleteOptions.gracePeriodSeconds (an int64, or a query string); a pod treats a negative one as 1."""
    if raw is None:
        return None
    bad = ApiError(400, "BadRequest", f"gracePeriodSeconds: invalid value {raw!r}")
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise bad
    try:
        value = int(raw)
    except ValueError as err:
        raise bad from err
    return 1 if pod and value < 0 else value


async def _json(request: web.Request) -> dict:
    try:
        body = await request.json(loads=json.loads)
    except ValueError as err:
        raise ApiError(400, "BadRequest", f"couldn't decode the body: {err}") from err
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body must be a JSON object")
    return body


def _patch_rv(content_type: str, raw: bytes) -> str | None:
    if content_type.startswith(patches.JSON_PATCH):
        return None  # a JSON patch states preconditions with "test" operations
    with contextlib.suppress(ValueError, AttributeError):
        return (json.loads(raw).get("metadata") or {}).get("resourceVersion")
    return None


class FakeEndpoint:
    """What a test or driver needs to talk to a fake wherever it runs: its URL, its controls over HTTP, tokens and
    kubeconfigs. `apply(fn, *args)` runs fn(FakeApi, *args) on the fake's own loop (its store is not
    thread-safe), in whichever process holds the fake."""

    tls: tuple[str, str] | None = None

    @property
    def url(self) -> str:
        raise NotImplementedError

    def apply(self, fn, *args, timeout: float = 10.0):
        raise NotImplementedError

    def control(self, op: str, **body: object) -> dict:
        req = urllib.request.Request(
            f"{self.url}/_fake/{op}",
            data=json.dumps(body).encode(),
            headers={CONTROL_HEADER: "yes", "Content-Type": JSON},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10, context=self.client_tls()) as resp:
            return json.loads(resp.read())

    def client_tls(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=self.tls[0]) if self.tls else None

    def _cluster(self) -> dict:
        cluster: dict = {"server": self.url}
        if self.tls is not None:
            with open(self.tls[0], "rb") as f:
                cluster["certificate-authority-data"] = base64.b64encode(f.read()).decode()
        return cluster

    def token(self, token: str, service_account: str | None = None, **user: object) -> str:
        """Register a bearer token: for `namespace/name` of a service account, or a user (username, groups)."""
        if service_account is not None:
            self.control("token", token=token, service_account=service_account)
        else:
            self.control("token", token=token, **user)
        return token

    def kubeconfig(self, path: str, token: str | None = None) -> str:
        """A kubeconfig for this server; without a token its requests are the administrator's."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": self._cluster()}],
            "users": [{"name": "u", "user": {"token": token} if token else {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u"}}],
            "current-context": "fake",
        }
        with open(path, "w") as f:
            json.dump(doc, f)
        return path


class FakeApiServer(FakeEndpoint):
    """The fake on its own thread and event loop, so sync tests, subprocesses (kubectl) and async clients
    can all use it."""

    def __init__(self, namespaces: tuple[str, ...] = (), tls: tuple[str, str] | None = None) -> None:
        """`namespaces`: tenant namespaces that exist from the start, beside the system ones. `tls`: serve
        HTTPS with this certificate and key (client-go sends bearer tokens over HTTPS only)."""
        self.api = FakeApi()
        self.tls = tls
        for ns in namespaces:
            self.api.store.create(NAMESPACES, "", {"metadata": {"name": ns}})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="fakeapi")
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> FakeApiServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.api.app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        ctx = None
        if self.tls is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(*self.tls)
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        async def _stop() -> None:
            for w in self.api.store.watchers + self.api.store.frozen:
                w.close()
            await asyncio.sleep(0.05)
            await self.api.admission.close()
            if self._runner is not None:
                await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def call(self, fn, *args):
        return self.apply(lambda _api: fn(*args))

    def apply(self, fn, *args, timeout: float = 10.0):
        async def run():
            return fn(self.api, *args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)
