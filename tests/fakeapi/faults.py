"""Fault injection for the fake apiserver: answers refused before the write (the object is unchanged),
answers lost after it (the write is committed, the client sees an error or a dropped connection), answers
given before a write that is carried out later (`late`: the apiserver's timeout filter answers 504 while the
handler goes on, and a write in flight to etcd still commits), latency, and a log of every request with who
sent it and what it was answered, for auditors."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from aiohttp import web

from .errors import ApiError

REASONS = {409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout", 429: "TooManyRequests"}
DROP = 0  # a lost answer's code: the connection closes without one


@dataclass(slots=True)
class Fault:
    code: int  # the status answered; DROP (after the write only): the connection is closed instead
    count: int  # how many matching requests it hits
    verb: str | None = None
    path_contains: str = ""
    after: bool = False  # committed, answer lost: the write happens, the client never learns it did
    rate: float = 1.0  # the chance a matching request is hit (seeded)
    agent_contains: str = ""  # only requests of clients whose User-Agent contains this
    late: float = 0.0  # > 0: answered `code` at once, the request carried out this many seconds later

    def matches(self, request: web.Request, rng: random.Random) -> bool:
        if self.count <= 0 or not _selects(request, self.verb, self.path_contains, self.agent_contains):
            return False
        if self.rate < 1.0 and rng.random() >= self.rate:
            return False
        self.count -= 1
        return True


@dataclass(slots=True)
class Latency:
    seconds: float
    verb: str | None = None
    path_contains: str = ""
    jitter: float = 0.0  # up to this many seconds more, uniformly
    agent_contains: str = ""


def _selects(request: web.Request, verb: str | None, path: str, agent: str) -> bool:
    return (
        verb in (None, request.method)
        and path in request.path_qs
        and (not agent or agent in request.headers.get("User-Agent", ""))
    )


@dataclass(slots=True)
class Faults:
    faults: list[Fault] = field(default_factory=list)
    latencies: list[Latency] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    log: list[dict] = field(default_factory=list)  # every API request: t (monotonic), verb, path, agent, code
    injected: dict[str, int] = field(default_factory=dict)  # "before 500", "after 0", ... → count

    def control(self, op: str, body: dict) -> bool:
        """Apply a /_fake/ control op of this module; False if the op is not one of them."""
        if op == "fault":
            self.faults.append(
                Fault(
                    int(body["code"]),
                    int(body.get("count", 1)),
                    body.get("verb"),
                    body.get("path_contains", ""),
                    bool(body.get("after", False)),
                    float(body.get("rate", 1.0)),
                    body.get("agent_contains", ""),
                    float(body.get("late", 0.0)),
                )
            )
        elif op == "delay":
            self.latencies.append(
                Latency(
                    float(body["seconds"]),
                    body.get("verb"),
                    body.get("path_contains", ""),
                    float(body.get("jitter", 0)),
                    body.get("agent_contains", ""),
                )
            )
        elif op == "clear-faults":
            self.faults.clear()
            self.latencies.clear()
        elif op == "seed":
            self.rng.seed(int(body["seed"]))
        else:
            return False
        return True

    async def before(self, request: web.Request) -> None:
        """Latency, then a fault that refuses the request before anything is written."""
        pause = 0.0
        for lat in self.latencies:
            if _selects(request, lat.verb, lat.path_contains, lat.agent_contains):
                pause += lat.seconds + (self.rng.random() * lat.jitter if lat.jitter else 0.0)
        if pause:
            await asyncio.sleep(pause)
        for f in self.faults:
            if not f.after and not f.late and f.matches(request, self.rng):
                self._count(f)
                self._log(request, f.code)
                raise ApiError(f.code, REASONS.get(f.code, "InternalError"), f"injected fault {f.code}")

    def late(self, request: web.Request) -> Fault | None:
        """A late fault this request meets (checked before `before`): the caller answers its code now and
        carries the request out `late` seconds later."""
        for f in self.faults:
            if f.late and f.matches(request, self.rng):
                self._count(f)
                self._log(request, f.code)["lost"] = True
                return f
        return None

    def after(self, request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        """Log the request; a matching after-fault replaces a successful write's answer with an error
        (raised as ApiError) or drops the connection."""
        entry = self._log(request, resp.status)
        if request.method == "GET" or resp.status >= 300:
            return resp
        for f in self.faults:
            if f.after and f.matches(request, self.rng):
                self._count(f)
                entry["lost"] = True
                if f.code == DROP and request.transport is not None:
                    request.transport.abort()  # the client sees the connection reset, no answer
                    return resp
                raise ApiError(f.code, REASONS.get(f.code, "InternalError"), f"injected fault {f.code} (committed)")
        return resp

    def _log(self, request: web.Request, code: int) -> dict:
        entry = {
            "t": time.monotonic(),
            "verb": request.method,
            "path": request.path,
            "agent": request.headers.get("User-Agent", ""),
            "code": code,
            "lost": False,
        }
        self.log.append(entry)
        return entry

    def _count(self, f: Fault) -> None:
        key = f"{'late' if f.late else 'after' if f.after else 'before'} {f.code}"
        self.injected[key] = self.injected.get(key, 0) + 1
