"""`fairgpu run`: the controller, leader election, the webhook, and the health, metrics and dashboard
servers, wired together.

Each server has its own port: probes (the kubelet needs them on the pod's address), metrics (Prometheus),
and the dashboard, which shows every namespace's pods and queues and so listens on 127.0.0.1 unless it is
put behind Kubernetes authentication and authorization (authn.KubeAuth). The webhook runs on a thread of
its own (webhook_server.py), off the scheduling path."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from fairgpu.errors import FairgpuError
from fairgpu.framework.profile import Profile
from fairgpu.framework.scheduler import CycleObserver, CycleResult, Scheduler
from fairgpu.hamiconfig import DEFAULT as DEFAULT_HAMI
from fairgpu.hamiconfig import HamiConfig
from fairgpu.k8s.authn import KubeAuth
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.elector_process import ElectorProcess
from fairgpu.k8s.heartbeat import STALE_AFTER, Heartbeat
from fairgpu.k8s.identity import TRUSTED_CONFIGMAP, Trust, TrustedIdentities
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.queues import queue_from_cr
from fairgpu.k8s.recording import PodTimes
from fairgpu.k8s.replica import run_replica
from fairgpu.k8s.reporter import Reporter
from fairgpu.k8s.webhook import webhook_app
from fairgpu.k8s.webhook_server import WebhookServer
from fairgpu.k8s.writes import Writes
from fairgpu.observe.metrics import SchedulingMetrics
from fairgpu.observe.server import Beside, create_app
from fairgpu.observe.source import LiveSource
from fairgpu.twin.recorder import EngineRecorder, Recorder
from fairgpu.twin.writer import TraceWriter

log = logging.getLogger(__name__)


@dataclass(slots=True)
class LiveApps:
    dashboard: Starlette  # the app `simulate --serve` serves: the dashboard, its JSON API, probes and metrics
    probes: Starlette  # /healthz, /readyz
    metrics: Starlette  # /metrics


@dataclass(slots=True)
class _Feed:
    """Each cycle feeds the Prometheus counters and the dashboard's queue history."""

    metrics: SchedulingMetrics
    source: LiveSource
    also: tuple[CycleObserver, ...] = ()  # the trace recorder, with --record

    def on_cycle(self, sched: Scheduler, result: CycleResult, now: float, seconds: float) -> None:
        self.metrics.on_cycle(sched, result, now, seconds)
        self.source.history.sample(now, sched)
        for observer in self.also:
            observer.on_cycle(sched, result, now, seconds)


def dashboard_app(controller: Controller, name: str) -> Starlette:
    return live_apps(controller, name).dashboard


def live_apps(controller: Controller, name: str, also: tuple[CycleObserver, ...] = ()) -> LiveApps:
    """What `fairgpu run` serves, read from the controller's engine as it stands: /healthz (the scheduling
    loop passes: heartbeat.py), /readyz (the caches are synced; a standby is ready too, it is warm), /metrics
    (docs/metrics.md), the dashboard and its JSON API (docs/dashboard.md). `name` names the cluster."""
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

    controller.observer = _Feed(metrics, source, also)
    unaccounted = Gauge(
        "fairgpu_hami_unaccounted_pods",
        "Bound pods whose HAMi allocation record could not be read or did not fit: their cards count as fully used.",
        registry=registry,
    )
    unaccounted.set_function(lambda: len(controller.unaccounted))
    dashboard = create_app(source, registry)

    async def metrics_route(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def ready(_: Request) -> Response:
        return PlainTextResponse("ok") if source.ready() else PlainTextResponse("not ready", 503)

    def healthy(_: Request) -> Response:
        """The scheduling loop passes (heartbeat.py); a hung one fails the liveness probe: the kubelet restarts it."""
        beat = controller.heartbeat
        if beat.stale():
            age = beat.age() or 0.0
            return PlainTextResponse(
                f"the scheduling loop has not passed for {age:.1f}s (bound {beat.stale_after:g}s)", 503
            )
        return PlainTextResponse("ok")

    probes = Starlette(routes=[Route("/healthz", healthy), Route("/readyz", ready)])
    return LiveApps(dashboard, probes, Starlette(routes=[Route("/metrics", metrics_route)]))


@dataclass(slots=True, frozen=True)
class Listen:
    """Where `fairgpu run` serves what."""

    health: tuple[str, int] = ("0.0.0.0", 8080)
    metrics: tuple[str, int] = ("0.0.0.0", 8081)
    dashboard: tuple[str, int] = ("127.0.0.1", 8082)
    dashboard_auth: bool = False  # TokenReview + SubjectAccessReview in front of the dashboard
    metrics_auth: bool = False
    webhook: tuple[str, int] = ("0.0.0.0", 8443)

    def check(self) -> None:
        """Refuses to show every namespace's pods to anyone who can reach the pod."""
        if not self.dashboard_auth and not _loopback(self.dashboard[0]):
            raise FairgpuError(
                f"--dashboard-host {self.dashboard[0]} exposes every namespace's pods and queues: "
                "add --dashboard-auth (Kubernetes TokenReview and SubjectAccessReview) or keep 127.0.0.1"
            )


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def run(
    kubeconfig: str | None,
    profile: Profile,
    scheduler_name: str,
    identity: str,
    leader_elect: bool,
    lease_namespace: str,
    listen: Listen,
    tls: tuple[str, str] | None = None,
    trust: Trust | TrustedIdentities | None = None,
    hami: HamiConfig = DEFAULT_HAMI,
    record: TraceWriter | None = None,
    trust_configmap: tuple[str, str] = TRUSTED_CONFIGMAP,
    elector_in: str = "thread",
    stale_after: float = STALE_AFTER,
) -> None:
    listen.check()
    heartbeat = Heartbeat(stale_after)  # the loop's proof of life, read by the elector and /healthz
    writes = Writes()  # its writes on the wire, read by the elector's hand-over of a hung leader's lease
    port = await KubeClient.connect(kubeconfig)
    # A thread by default: in a process of its own (k8s/elector_process.py) the lease survives long steps that
    # hold the interpreter lock, but it was not shown better under CPU starvation (docs/deploy.md).
    elector: LeaderElector | ElectorProcess | None = None
    if leader_elect and elector_in == "process":
        elector = ElectorProcess(
            kubeconfig, lease_namespace, scheduler_name, identity, heartbeat=heartbeat, writes=writes
        )
    elif leader_elect:
        elector = LeaderElector(port, lease_namespace, scheduler_name, identity, heartbeat=heartbeat, writes=writes)
    controller = Controller(
        port, profile, scheduler_name, leadership=elector, hami_config=hami, heartbeat=heartbeat, writes=writes
    )
    if isinstance(trust, TrustedIdentities):
        report_trust(trust, controller.reporter, trust_configmap)
    recorder: tuple[EngineRecorder, ...] = ()
    if record is not None:
        times = PodTimes(controller.clock, scheduler_name)
        times.attach(controller.pods)
        recorder = (EngineRecorder(Recorder(record, "run", scheduler_name, profile.name), times.run_length),)
    apps = live_apps(controller, port.api.configuration.host or "", recorder)
    if listen.dashboard_auth:
        apps.dashboard.add_middleware(KubeAuth, port=port, resource="dashboard")
    if listen.metrics_auth:
        apps.metrics.add_middleware(KubeAuth, port=port, resource="metrics")
    hooks = None
    try:
        if tls is not None:  # the admission webhook answers on every replica, leader or not, off this loop
            hooks = WebhookServer(
                lambda: webhook_app(lambda name: queue_namespaces(controller, name), scheduler_name, trust, hami),
                *listen.webhook,
                *tls,
                watch=(trust.check,) if isinstance(trust, TrustedIdentities) else (),
            ).start()
        async with (
            Beside(apps.probes, *listen.health),
            Beside(apps.metrics, *listen.metrics),
            Beside(apps.dashboard, *listen.dashboard),
        ):
            log.info(
                "fairgpu %s: probes on %s:%d, metrics on %s:%d, dashboard on %s:%d",
                identity,
                *listen.health,
                *listen.metrics,
                *listen.dashboard,
            )
            await run_replica(controller, elector)  # stopped, it hands the lease over (replica.py)
    finally:
        if hooks is not None:
            hooks.stop()
        if record is not None:
            record.close()
        await port.close()


def report_trust(trust: TrustedIdentities, reporter: Reporter, configmap: tuple[str, str]) -> None:
    """Reloads of the mounted list, which the webhook's thread checks, become Events on its ConfigMap, written
    from this loop (the reporter's client belongs to it)."""
    loop = asyncio.get_running_loop()

    def news(problem: bool, message: str) -> None:
        with contextlib.suppress(RuntimeError):  # this loop has closed: the process is stopping
            loop.call_soon_threadsafe(reporter.trust_news, configmap, problem, message)

    trust.on_news = news


def queue_namespaces(controller: Controller, name: str) -> tuple[str, ...] | None:
    """From the warm queue cache: the namespaces that may use a queue, None if it does not exist or is invalid."""
    obj = controller.queues.cache.get(f"/{name}")
    if obj is None:
        return None
    try:
        return queue_from_cr(obj).namespaces
    except ValueError:
        return None
