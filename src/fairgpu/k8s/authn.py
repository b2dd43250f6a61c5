"""Kubernetes authentication and authorization in front of an HTTP app, as kube-rbac-proxy does: the
caller's bearer token is checked with a TokenReview, then what it asks for with a SubjectAccessReview.

The review names a resource of fairgpu's API group (`fairgpu.io/dashboard`, `fairgpu.io/metrics`; verb from
the HTTP method), not the request's path: every cluster's bootstrap role `system:discovery` grants any
authenticated user the non-resource paths `/api/*`, so a path-based check would let everyone read the
dashboard's `/api/...`. Fails closed: no token 401, a token the API
server does not know 401, a refusal 403, an API server that cannot be asked 503. Answers are cached briefly,
so a page's burst of requests costs two reviews, not two per request."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from fairgpu.errors import KubeError
from fairgpu.k8s.port import SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS, KubePort

VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
CACHE_LIMIT = 4096
GROUP = "fairgpu.io"


@dataclass(slots=True, frozen=True)
class Caller:
    username: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class KubeAuth:
    def __init__(
        self,
        app: ASGIApp,
        port: KubePort,
        resource: str,
        ttl: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`resource`: what RBAC must grant, `get` on `fairgpu.io/<resource>` to read."""
        self.app, self.port, self.resource, self.ttl, self.clock = app, port, resource, ttl, clock
        self._callers: dict[str, tuple[float, Caller | None]] = {}
        self._decisions: dict[tuple[Caller, str], tuple[float, bool]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization", b"").decode()
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        verb = VERBS.get(scope["method"], scope["method"].lower())
        try:
            caller = await self._authenticate(token) if token else None
            if caller is None:
                reply = PlainTextResponse("Unauthorized", 401, headers={"WWW-Authenticate": "Bearer"})
            elif not await self._authorize(caller, verb):
                what = f"verb={verb}, resource={self.resource}.{GROUP}"
                reply = PlainTextResponse(f"Forbidden (user={caller.username}, {what})", 403)
            else:
                await self.app(scope, receive, send)
                return
        except KubeError as err:
            reply = PlainTextResponse(f"cannot check credentials with the API server: {err}", 503)
        await reply(scope, receive, send)

    async def _authenticate(self, token: str) -> Caller | None:
        hit = self._callers.get(token)
        if hit is not None and hit[0] > self.clock():
            return hit[1]
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        status = (await self.port.create(TOKEN_REVIEWS, review)).get("status") or {}
        caller = None
        if status.get("authenticated"):
            user = status.get("user") or {}
            extra = tuple(sorted((k, tuple(v)) for k, v in (user.get("extra") or {}).items()))
            caller = Caller(user.get("username", ""), user.get("uid", ""), tuple(user.get("groups") or ()), extra)
        self._remember(self._callers, token, caller)
        return caller

    async def _authorize(self, caller: Caller, verb: str) -> bool:
        key = (caller, verb)
        hit = self._decisions.get(key)
        if hit is not None and hit[0] > self.clock():
            return hit[1]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": caller.username,
                "uid": caller.uid,
                "groups": list(caller.groups),
                "extra": {k: list(v) for k, v in caller.extra},
                "resourceAttributes": {"group": GROUP, "resource": self.resource, "verb": verb},
            },
        }
        allowed = bool(((await self.port.create(SUBJECT_ACCESS_REVIEWS, review)).get("status") or {}).get("allowed"))
        self._remember(self._decisions, key, allowed)
        return allowed

    def _remember(self, cache: dict, key: object, value: object) -> None:
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
        cache[key] = (self.clock() + self.ttl, value)
