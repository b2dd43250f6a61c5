"""The HTTP server: /healthz, /readyz, /metrics, the dashboard and its read-only JSON API — one app for
`simulate --serve` (a replay) and `fairgpu run` (a live controller).

Every API route takes an optional `?t=SECONDS`: a replay moves there first (a live cluster ignores it).
Routes that read the scheduler are coroutines: they run on the server's event loop, which for `fairgpu run`
is the controller's own, so they read its engine between two of its steps, never in the middle of one.
"""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from fairgpu.framework.scheduler import Scheduler
from fairgpu.observe import views
from fairgpu.observe.metrics import EngineCollector
from fairgpu.observe.source import Source

STATIC = Path(__file__).parent / "static"


def create_app(source: Source, registry: CollectorRegistry) -> Starlette:
    """`registry` holds the driver's SchedulingMetrics; the engine's gauges are added to it here."""
    registry.register(EngineCollector(source))

    def at(request: Request) -> None:
        raw = request.query_params.get("t")
        if raw is not None:
            try:
                t = float(raw)
            except ValueError:
                raise ValueError(f"t: {raw!r} is not a number of seconds") from None
            if not math.isfinite(t) or t < 0:
                raise ValueError(f"t: {raw!r} must be a finite, non-negative number of seconds")
            if source.horizon is not None and t > source.horizon:
                raise ValueError(f"t: {raw!r} is past the horizon ({source.horizon:g} s)")
            source.seek(t)

    def api(build):
        async def endpoint(request: Request) -> Response:
            # one lock over the move and the read, so a concurrent request for another time cannot
            # slip in between and the document is all of one instant
            with source.lock:
                try:
                    at(request)
                except ValueError as err:
                    return JSONResponse({"error": str(err)}, status_code=400)
                if source.sched is None:
                    return JSONResponse({"error": "no scheduler state yet (caches syncing, or standing by)"}, 503)
                try:
                    doc = build(request)
                except KeyError as err:
                    return JSONResponse({"error": f"not found: {err.args[0]}"}, status_code=404)
                except ValueError as err:  # a parameter out of range
                    return JSONResponse({"error": str(err)}, status_code=400)
                return JSONResponse({"time": source.now, **doc})

        return endpoint

    def engine() -> Scheduler:
        sched = source.sched
        assert sched is not None, "api() answers 503 until an engine exists"
        return sched

    def info(_: Request) -> dict[str, Any]:
        names = engine().tree.names()
        return {"name": source.name, "profile": source.profile, "horizon": source.horizon, "queues": names}

    def workload(request: Request) -> dict[str, Any]:
        return engine().explain(request.path_params["name"], source.now).to_json()

    def workloads(request: Request) -> dict[str, Any]:
        q = request.query_params
        return views.workloads_view(
            engine(),
            q.get("queue") or None,
            q.get("search", ""),
            _int_param(q, "offset", 0),
            _int_param(q, "limit", views.MAX_WORKLOADS),
        )

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/healthz", lambda _: PlainTextResponse("ok")),
        Route("/readyz", lambda _: PlainTextResponse("ok") if source.ready() else PlainTextResponse("not ready", 503)),
        Route("/metrics", metrics),
        Route("/", lambda _: FileResponse(STATIC / "index.html")),
        Route("/api/info", api(info)),
        Route("/api/cluster", api(lambda _: views.cluster_view(engine()))),
        Route("/api/nodes/{name}", api(lambda rq: views.node_view(engine(), rq.path_params["name"]))),
        Route("/api/queues", api(lambda _: views.queue_view(engine(), source.history))),
        Route("/api/workloads", api(workloads)),
        Route("/api/workloads/{name:path}", api(workload)),  # live workload names are namespace/name
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    return Starlette(routes=routes)


def _int_param(params: Any, name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: {raw!r} is not a whole number") from None


class _Serving:
    """uvicorn serving an app; `port` is the one the OS gave when asked for 0."""

    def __init__(self, app: Starlette, host: str, port: int) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Beside(_Serving):
    """uvicorn on the running event loop, beside the driver whose scheduler it shows (`fairgpu run`)."""

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(app, host, port)
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> Beside:
        self._task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self._task.done():  # it could not listen (the port is taken, say): say why
                self._task.result()
                raise RuntimeError("the dashboard server stopped while starting")
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self._task is not None:
            await self._task


class Background(_Serving):
    """uvicorn in a thread of its own (tests, benchmarks)."""

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(app, host, port)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Background:
        self.thread.start()
        for _ in range(500):  # at most 5 s
            if self.server.started:
                break
            self.thread.join(0.01)
        if not self.server.started:
            raise RuntimeError("the dashboard server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
