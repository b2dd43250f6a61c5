"""Kubernetes authentication and authorization in front of an HTTP app, as kube-rbac-proxy does: the
caller's bearer token is checked with a TokenReview, then what it asks for with a SubjectAccessReview on the
request's path (a non-resource URL, verb from the HTTP method). Fails closed: no token 401, a token the API
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


@dataclass(slots=True, frozen=True)
class Caller:
    username: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class KubeAuth:
    def __init__(
        self, app: ASGIApp, port: KubePort, ttl: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.app, self.port, self.ttl, self.clock = app, port, ttl, clock
        self._callers: dict[str, tuple[float, Caller | None]] = {}
        self._decisions: dict[tuple[Caller, str, str], tuple[float, bool]] = {}

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
            elif not await self._authorize(caller, verb, scope["path"]):
                reply = PlainTextResponse(f"Forbidden (user={caller.username}, verb={verb}, path={scope['path']})", 403)
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

    async def _authorize(self, caller: Caller, verb: str, path: str) -> bool:
        key = (caller, verb, path)
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
                "nonResourceAttributes": {"path": path, "verb": verb},
            },
        }
        allowed = bool(((await self.port.create(SUBJECT_ACCESS_REVIEWS, review)).get("status") or {}).get("allowed"))
        self._remember(self._decisions, key, allowed)
        return allowed

    def _remember(self, cache: dict, key: object, value: object) -> None:
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
        cache[key] = (self.clock() + self.ttl, value)
