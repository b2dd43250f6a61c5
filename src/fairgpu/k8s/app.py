"""`fairgpu run`: the controller, leader election, the webhook, and the health, metrics and dashboard
server, wired together."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.queues import queue_from_cr
from fairgpu.k8s.webhook import tls_context, webhook_app
from fairgpu.observe.metrics import SchedulingMetrics
from fairgpu.observe.server import Beside, create_app
from fairgpu.observe.source import LiveSource

log = logging.getLogger(__name__)


def dashboard_app(controller: Controller, name: str) -> Starlette:
    """What `fairgpu run` serves on its health port — the app `simulate --serve` serves, read from the
    controller's engine as it stands: /healthz (the process answers), /readyz (the caches are synced; a
    standby is ready too, it is warm), /metrics (docs/metrics.md), the dashboard and its JSON API
    (docs/dashboard.md). `name` names the cluster in the dashboard."""
    registry = CollectorRegistry()  # private: nothing else in the process shows up on /metrics
    metrics = SchedulingMetrics(registry)
    source = LiveSource(
        lambda: controller.engine,
        name,
        controller.profile.name,
        clock=controller.clock,
        leader=controller.leading.is_set,
        synced=controller.synced,
    )

    def on_cycle(sched: Scheduler, result: CycleResult, now: float, seconds: float) -> None:
        metrics.on_cycle(sched, result, now, seconds)
        source.history.sample(now, sched)

    controller.on_cycle = on_cycle
    return create_app(source, registry)


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
    controller = Controller(port, profile, scheduler_name, leadership=elector)
    hooks = None
    try:
        async with Beside(dashboard_app(controller, port.api.configuration.host), health_host, health_port):
            log.info("fairgpu %s serving health, metrics and dashboard on %s:%d", identity, health_host, health_port)
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
                await asyncio.gather(*tasks, return_exceptions=True)
    finally:
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
