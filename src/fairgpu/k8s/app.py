"""`fairgpu run`: the controller, leader election and the health endpoints, wired together."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.queues import queue_from_cr
from fairgpu.k8s.webhook import tls_context, webhook_app
from fairgpu.observe.metrics import EngineCollector, SchedulingMetrics

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ControllerSource:
    """What the metrics read: the controller's engine as it stands (None until nodes are known)."""

    controller: Controller
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def sched(self) -> Scheduler | None:
        return self.controller.engine

    def is_leader(self) -> bool:
        return self.controller.leading.is_set()


def metrics_registry(controller: Controller) -> CollectorRegistry:
    """A private registry: gauges read from the engine at scrape time, counters fed by each cycle."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(ControllerSource(controller)))  # type: ignore[arg-type]
    controller.on_cycle = SchedulingMetrics(registry).on_cycle
    return registry


def health_app(controller: Controller) -> web.Application:
    """/healthz: the process answers. /readyz: the caches are synced (a standby is ready too: it is warm).
    /metrics: Prometheus exposition of the engine and of what the scheduler did (docs/metrics.md)."""
    registry = metrics_registry(controller)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        synced = all(i.synced.is_set() for i in (controller.nodes, controller.pods, controller.queues))
        return web.Response(text="ok" if synced else "caches not synced", status=200 if synced else 503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def run(
    kubeconfig: str | None,
    profile: Profile,
    scheduler_name: str,
    identity: str,
    leader_elect: bool,
    lease_namespace: str,
    health_host: str,
    health_port: int,
    webhook_port: int = 8443,
    tls: tuple[str, str] | None = None,
) -> None:
    port = await KubeClient.connect(kubeconfig)
    elector = LeaderElector(port, lease_namespace, scheduler_name, identity) if leader_elect else None
    controller = Controller(port, profile, scheduler_name, leading=elector.leading if elector else None)
    runner = web.AppRunner(health_app(controller))
    await runner.setup()
    await web.TCPSite(runner, health_host, health_port).start()
    log.info("fairgpu %s serving health on %s:%d", identity, health_host, health_port)
    hooks = None
    if tls is not None:  # the admission webhook answers on every replica, leader or not
        hooks = web.AppRunner(webhook_app(lambda name: queue_namespaces(controller, name), scheduler_name))
        await hooks.setup()
        await web.TCPSite(hooks, health_host, webhook_port, ssl_context=tls_context(*tls)).start()
    tasks = [asyncio.create_task(controller.run())]
    if elector is not None:
        tasks.append(asyncio.create_task(elector.run()))
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await runner.cleanup()
        if hooks is not None:
            await hooks.cleanup()
        await port.close()


def queue_namespaces(controller: Controller, name: str) -> tuple[str, ...] | None:
    """From the warm queue cache: the namespaces that may use a queue, None if it does not exist or is invalid."""
    obj = controller.queues.cache.get(f"/{name}")
    if obj is None:
        return None
    try:
        return queue_from_cr(obj).namespaces
    except ValueError:
        return None
