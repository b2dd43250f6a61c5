"""Admission as the apiserver runs it after authorisation (design/fake-apiserver.md §7b): registered mutating
webhooks (configurations in name order, their webhooks in order), then ValidatingAdmissionPolicies, then
validating webhooks. Webhooks are called over HTTPS with AdmissionReview v1, honouring rules,
namespaceSelector, objectSelector, matchConditions, timeoutSeconds and failurePolicy.

CEL (matchConditions, policies) is evaluated with cel-python. Kubernetes' CEL libraries (`authorizer`,
`quantity()`, `url()`, regex extensions) are not there: an expression using them fails as an evaluation
error, which the failure policy then decides, and the error names the expression.
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from dataclasses import dataclass
from functools import lru_cache

import aiohttp
import celpy
from celpy import json_to_cel

from .errors import ApiError
from .patches import json_patch
from .selectors import label_selector
from .store import BY_KIND, Resource, Store


@dataclass(slots=True)
class Request:
    """What admission is asked about one write."""

    operation: str  # CREATE, UPDATE, DELETE
    res: Resource
    sub: str
    namespace: str
    name: str
    obj: dict | None
    old: dict | None
    user: dict  # userInfo

    def review(self, object_: dict | None) -> dict:
        kind = {"group": self.res.group, "version": self.res.version, "kind": self.res.kind}
        resource = {"group": self.res.group, "version": self.res.version, "resource": self.res.plural}
        req = {
            "uid": str(uuid.uuid4()),
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": self.name,
            "namespace": self.namespace,
            "operation": self.operation,
            "userInfo": self.user,
            "object": object_,
            "oldObject": self.old,
            "dryRun": False,
        }
        if self.sub:
            req["subResource"] = req["requestSubResource"] = self.sub
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}

    def cel_request(self) -> dict:
        return {k: v for k, v in self.review(None)["request"].items() if k not in ("object", "oldObject")}


@lru_cache(maxsize=512)
def _program(expression: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(expression))


def cel(expression: str, activation: dict) -> object:
    """Evaluate one expression; an error of any kind is a ValueError naming it."""
    try:
        out = _program(expression).evaluate({k: json_to_cel(v) for k, v in activation.items()})
    except Exception as err:  # celpy raises parse, type and evaluation errors of several kinds
        raise ValueError(f"expression {expression!r}: {str(err).splitlines()[0][:200]}") from err
    if isinstance(out, celpy.CELEvalError):
        raise ValueError(f"expression {expression!r}: {str(out.args[0] if out.args else out)[:200]}")
    return out


def _rule_matches(rule: dict, req: Request) -> bool:
    ops = rule.get("operations") or []
    if "*" not in ops and req.operation not in ops:
        return False
    if not any(g in ("*", req.res.group) for g in rule.get("apiGroups") or []):
        return False
    if not any(v in ("*", req.res.version) for v in rule.get("apiVersions") or []):
        return False
    wanted = f"{req.res.plural}/{req.sub}" if req.sub else req.res.plural
    resources = rule.get("resources") or []
    if not any(
        r == wanted or r == "*/*" or (r == "*" and not req.sub) or r == f"{req.res.plural}/*" for r in resources
    ):
        return False
    scope = rule.get("scope", "*")
    return scope == "*" or (scope == "Namespaced") == req.res.namespaced


class Admission:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.services: dict[tuple[str, str], str] = {}  # (namespace, service) → "127.0.0.1:PORT" (test control)
        self.calls: list[dict] = []  # every webhook call: name, operation, outcome
        # As a real apiserver, one client whose connections to webhooks are kept alive and one TLS context
        # per CA bundle: a handshake per call made a soak's fake loop too slow to keep leases renewed.
        self._http: aiohttp.ClientSession | None = None
        self._tls: dict[str, ssl.SSLContext] = {}

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    def _context(self, bundle: str) -> ssl.SSLContext:
        if bundle not in self._tls:
            cadata = base64.b64decode(bundle).decode() if bundle else None
            self._tls[bundle] = ssl.create_default_context(cadata=cadata)
        return self._tls[bundle]

    def active(self) -> bool:
        return any(
            self.store.by_type.get((r.group, r.plural))
            for r in (
                BY_KIND["MutatingWebhookConfiguration"],
                BY_KIND["ValidatingWebhookConfiguration"],
                BY_KIND["ValidatingAdmissionPolicyBinding"],
            )
        )

    async def admit(self, req: Request) -> dict | None:
        """The object as mutating admission leaves it; ApiError if anything refuses it."""
        if not self.active():
            return req.obj
        for config in sorted(self.store.list_all(BY_KIND["MutatingWebhookConfiguration"]), key=_name):
            for hook in config.get("webhooks") or []:
                if self._matches(hook, req):
                    req.obj = await self._call(hook, req, mutating=True)
        self._policies(req)
        for config in sorted(self.store.list_all(BY_KIND["ValidatingWebhookConfiguration"]), key=_name):
            for hook in config.get("webhooks") or []:
                if self._matches(hook, req):
                    await self._call(hook, req, mutating=False)
        return req.obj

    # -- matching -----------------------------------------------------------------------------------
    def _namespace_labels(self, req: Request) -> dict | None:
        if req.res.kind == "Namespace":
            return ((req.obj or req.old or {}).get("metadata") or {}).get("labels") or {}
        if not req.res.namespaced:
            return None
        ns = self.store.objects.get(("", "namespaces", "", req.namespace))
        return ((ns or {}).get("metadata") or {}).get("labels") or {"kubernetes.io/metadata.name": req.namespace}

    def _matches(self, hook: dict, req: Request) -> bool:
        if not any(_rule_matches(rule, req) for rule in hook.get("rules") or []):
            return False
        labels = self._namespace_labels(req)
        selector = label_selector(hook.get("namespaceSelector"))
        if labels is not None and selector is not None and not all(r.matches(labels) for r in selector):
            return False
        selector = label_selector(hook.get("objectSelector"))
        if selector:
            objects = [o for o in (req.obj, req.old) if o is not None]
            if not any(
                all(r.matches((o.get("metadata") or {}).get("labels") or {}) for r in selector) for o in objects
            ):
                return False
        return self._conditions(hook.get("matchConditions") or [], req, hook.get("failurePolicy", "Fail"), hook["name"])

    def _conditions(
        self, conditions: list[dict], req: Request, policy: str, who: str, extra: dict | None = None
    ) -> bool:
        activation = {"object": req.obj, "oldObject": req.old, "request": req.cel_request(), **(extra or {})}
        for cond in conditions:
            try:
                if not cel(cond["expression"], activation):
                    return False
            except ValueError as err:
                if policy == "Ignore":
                    return False
                raise ApiError(
                    500, "InternalError", f"Internal error occurred: {who}: matchCondition {cond['name']}: {err}"
                ) from err
        return True

    # -- webhooks -----------------------------------------------------------------------------------
    def _url(self, config: dict) -> str:
        if config.get("url"):
            return config["url"]
        svc = config.get("service") or {}
        where = self.services.get((svc.get("namespace", ""), svc.get("name", "")))
        if where is None:
            raise OSError(f'service "{svc.get("namespace")}/{svc.get("name")}" has no endpoints')
        return f"https://{where}{svc.get('path', '')}"

    async def _call(self, hook: dict, req: Request, mutating: bool) -> dict | None:
        name, policy = hook["name"], hook.get("failurePolicy", "Fail")
        config = hook.get("clientConfig") or {}
        record = {"webhook": name, "operation": req.operation, "name": req.name}
        self.calls.append(record)
        url = ""
        try:
            url = self._url(config)
            ctx = self._context(config.get("caBundle") or "")
            timeout = aiohttp.ClientTimeout(total=float(hook.get("timeoutSeconds", 10)))
            if self._http is None:
                self._http = aiohttp.ClientSession()
            async with self._http.post(url, json=req.review(req.obj), ssl=ctx, timeout=timeout) as resp:
                if resp.status != 200:
                    raise OSError(f"the server responded with HTTP {resp.status}")
                doc = await resp.json()
            response = doc["response"]
        except (OSError, aiohttp.ClientError, TimeoutError, ValueError, KeyError, ssl.SSLError) as err:
            why = "context deadline exceeded" if isinstance(err, TimeoutError) else (str(err) or type(err).__name__)
            record["outcome"] = f"error: {why}"
            if policy == "Ignore":
                return req.obj
            raise ApiError(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{name}": '
                f'failed to call webhook: Post "{url}": {why}',
            ) from err
        if not response.get("allowed"):
            record["outcome"] = "denied"
            raise _denied(name, response.get("status") or {})
        record["outcome"] = "allowed"
        if mutating and response.get("patch"):
            if response.get("patchType") != "JSONPatch":
                raise ApiError(
                    500, "InternalError", f'Internal error occurred: webhook "{name}": unsupported patchType'
                )
            return json_patch(req.obj, json.loads(base64.b64decode(response["patch"])))
        return req.obj

    # -- ValidatingAdmissionPolicy --------------------------------------------------------------------
    def _policies(self, req: Request) -> None:
        policies = {p["metadata"]["name"]: p for p in self.store.list_all(BY_KIND["ValidatingAdmissionPolicy"])}
        for binding in sorted(self.store.list_all(BY_KIND["ValidatingAdmissionPolicyBinding"]), key=_name):
            policy = policies.get((binding.get("spec") or {}).get("policyName", ""))
            if policy is None:
                continue
            spec = policy.get("spec") or {}
            scope = spec.get("matchConstraints") or {}  # rules and selectors as a webhook's, no conditions
            keys = ("namespaceSelector", "objectSelector")
            hook = {"name": _name(policy), "rules": scope.get("resourceRules") or [], **{k: scope.get(k) for k in keys}}
            if not self._matches(hook, req):
                continue
            who = (
                f"ValidatingAdmissionPolicy '{policy['metadata']['name']}' with binding '{binding['metadata']['name']}'"
            )
            failure = spec.get("failurePolicy", "Fail")
            params: dict = {}
            if spec.get("paramKind"):  # the binding's paramRef names the object the policy reads as `params`
                ref = (binding.get("spec") or {}).get("paramRef") or {}
                kind = BY_KIND.get(spec["paramKind"].get("kind", ""))
                found = kind and self.store.objects.get(
                    (kind.group, kind.plural, ref.get("namespace", ""), ref.get("name"))
                )
                if not found:
                    if ref.get("parameterNotFoundAction") == "Allow":
                        continue
                    raise ApiError(403, "Forbidden", f"{who} denied request: no params found for policy binding")
                params = {"params": found}
            if not self._conditions(spec.get("matchConditions") or [], req, failure, who, params):
                continue
            variables: dict = {}
            activation = {"object": req.obj, "oldObject": req.old, "request": req.cel_request(), **params}
            try:
                for var in spec.get("variables") or []:
                    variables[var["name"]] = _plain(cel(var["expression"], {**activation, "variables": variables}))
                for check in spec.get("validations") or []:
                    if not cel(check["expression"], {**activation, "variables": variables}):
                        reason = check.get("reason", "Invalid")
                        code = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}
                        message = check.get("message") or f"failed expression: {check['expression']}"
                        raise ApiError(code.get(reason, 422), reason, f"{who} denied request: {message}")
            except ValueError as err:
                if failure == "Fail":
                    raise ApiError(403, "Forbidden", f"{who} denied request: {err}") from err


def _plain(value: object) -> object:
    """A CEL value back to JSON, to hand to the next expression as `variables.x`."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


def _denied(webhook: str, status: dict) -> ApiError:
    """webhookerrors.ToStatusErr: the webhook's code (at least 400) and its message after the webhook's name."""
    code = max(int(status.get("code") or 0), 400)
    denied_by = f'admission webhook "{webhook}" denied the request'
    if status.get("message"):
        message = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied_by}: {status['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return ApiError(code, status.get("reason") or "", message)


def _name(obj: dict) -> str:
    return obj["metadata"]["name"]
