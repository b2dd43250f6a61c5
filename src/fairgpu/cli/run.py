"""`fairgpu run`: the live scheduler."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from fairgpu.catalog import load_profile
from fairgpu.cli.base import app
from fairgpu.errors import FairgpuError, InputError
from fairgpu.k8s.heartbeat import STALE_AFTER, Heartbeat
from fairgpu.k8s.identity import FAIRGPU_SA, TRUSTED_CONFIGMAP
from fairgpu.terminal import fail
from fairgpu.twin.writer import TraceWriter


class ElectorIn(StrEnum):
    thread = "thread"
    process = "process"


@app.command("run")
def run_cmd(
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig file; without it, the pod's in-cluster service account.")
    ] = None,
    profile: Annotated[str, typer.Option(help="Profile name or YAML file.")] = "fairgpu",
    scheduler_name: Annotated[str, typer.Option(help="Pods with this spec.schedulerName are ours.")] = "fairgpu",
    leader_elect: Annotated[bool, typer.Option(help="Elect a leader on a Lease (run several replicas).")] = True,
    lease_namespace: Annotated[str, typer.Option(help="Namespace of the leader Lease.")] = "fairgpu-system",
    elector: Annotated[
        ElectorIn, typer.Option(metavar="WHERE", help="Where the leader elector runs: thread, or process (its own).")
    ] = ElectorIn.thread,
    identity: Annotated[str | None, typer.Option(help="This replica's name in the Lease (default: hostname).")] = None,
    heartbeat_timeout: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="A scheduling loop that has not passed for this long is hung: the replica gives up the lease and"
            " /healthz fails.",
        ),
    ] = STALE_AFTER,
    health_host: Annotated[str, typer.Option(help="Address of the /healthz and /readyz probes.")] = "0.0.0.0",
    health_port: Annotated[int, typer.Option(help="Port of the probes.")] = 8080,
    metrics_host: Annotated[str, typer.Option(help="Address of /metrics.")] = "0.0.0.0",
    metrics_port: Annotated[int, typer.Option(help="Port of /metrics.")] = 8081,
    metrics_auth: Annotated[
        bool, typer.Option(help="Check /metrics callers with TokenReview and SubjectAccessReview.")
    ] = False,
    dashboard_host: Annotated[
        str, typer.Option(help="Address of the dashboard; anything but loopback needs --dashboard-auth.")
    ] = "127.0.0.1",
    dashboard_port: Annotated[int, typer.Option(help="Port of the dashboard and its JSON API.")] = 8082,
    dashboard_auth: Annotated[
        bool, typer.Option(help="Check dashboard callers with TokenReview and SubjectAccessReview.")
    ] = False,
    webhook_port: Annotated[int, typer.Option(help="HTTPS port of the admission webhook.")] = 8443,
    tls_cert: Annotated[str | None, typer.Option(help="Webhook certificate (PEM); with --tls-key.")] = None,
    tls_key: Annotated[str | None, typer.Option(help="Webhook private key (PEM).")] = None,
    service_account: Annotated[
        str, typer.Option(help="fairgpu's own user name: the webhook lets it write scheduling keys.")
    ] = FAIRGPU_SA,
    trusted_identity: Annotated[
        list[str] | None,
        typer.Option(help="A user who may also write scheduling keys (HAMi's device plugin, say); repeatable."),
    ] = None,
    trusted_identities: Annotated[
        str | None,
        typer.Option(
            help="A directory of trusted identities, one per file: the ConfigMap the API server's policy reads."
        ),
    ] = None,
    trusted_identities_configmap: Annotated[
        str,
        typer.Option(
            help="NAMESPACE/NAME of the ConfigMap mounted at --trusted-identities: reloads and broken edits of it"
            " are Events on it."
        ),
    ] = "/".join(TRUSTED_CONFIGMAP),
    pod_controller: Annotated[
        list[str] | None,
        typer.Option(
            help="A user that makes pods or workloads from templates, whose objects keep the template's user;"
            " repeatable. Besides the ConfigMap's controller.* entries with --trusted-identities (where the API"
            " server's policy reads them), else instead of kube-controller-manager's."
        ),
    ] = None,
    hami_config: Annotated[
        str | None,
        typer.Option(help="HAMi's device config (device-config.yaml or its ConfigMap): names, defaults, lock expiry."),
    ] = None,
    record: Annotated[
        Path | None, typer.Option(help="Record what the engine sees and decides to this trace (docs/twin.md).")
    ] = None,
    record_max_mb: Annotated[float, typer.Option(help="Rotate the trace past this size.")] = 100.0,
    record_keep: Annotated[int, typer.Option(help="Rotated traces kept (FILE.1 … FILE.N).")] = 3,
) -> None:
    """Schedule pods on a live cluster (secondary scheduler, HAMi enforcement)."""
    import asyncio
    import contextlib
    import logging
    import signal
    import socket
    import sys

    from fairgpu.k8s import app as live
    from fairgpu.k8s.identity import DEFAULT_CONTROLLERS, Trust, TrustedIdentities, configmap_ref
    from fairgpu.k8s.kubeconfig import check_kubeconfig

    try:
        prof = load_profile(profile)
    except InputError as err:
        raise fail(f"--profile: {err}") from err
    from fairgpu import hamiconfig

    try:
        hami = hamiconfig.load(hami_config) if hami_config else hamiconfig.DEFAULT
    except InputError as err:
        raise fail(f"--hami-config: {err}") from err
    if (tls_cert is None) != (tls_key is None):
        raise fail("--tls-cert and --tls-key go together")
    tls = (tls_cert, tls_key) if tls_cert and tls_key else None
    try:
        Heartbeat(heartbeat_timeout)
    except InputError as err:
        raise fail(str(err)) from err
    listen = live.Listen(
        (health_host, health_port),
        (metrics_host, metrics_port),
        (dashboard_host, dashboard_port),
        dashboard_auth,
        metrics_auth,
        (health_host, webhook_port),
    )
    try:
        listen.check()
        check_kubeconfig(kubeconfig)  # after the addresses, so an unsafe exposure is named first
    except FairgpuError as err:
        raise fail(str(err)) from err
    # With the mounted ConfigMap its controller.* entries are the list, as for the API server's policy: no
    # default beside them that the policy would not know.
    controllers = pod_controller or (() if trusted_identities else DEFAULT_CONTROLLERS)
    fixed = Trust.of(service_account, trusted_identity or (), controllers)
    try:  # the mounted list is followed as the kubelet updates it
        trust = TrustedIdentities(trusted_identities, fixed) if trusted_identities else fixed
        trust_configmap = configmap_ref(trusted_identities_configmap)
    except InputError as err:
        raise fail(str(err)) from err
    if isinstance(trust, TrustedIdentities) and not trust().controllers:  # a ConfigMap from before they moved there
        raise fail(
            f"--trusted-identities: {trusted_identities} lists no workload controller (controller.* keys, as in"
            " deploy/trusted-identities.yaml) and no --pod-controller is given: every pod a Job or Deployment"
            " makes would be charged to the controller that made it"
        )
    try:
        writer = None if record is None else TraceWriter(record, int(record_max_mb * (1 << 20)), record_keep)
    except InputError as err:
        raise fail(str(err)) from err
    # stdout, where the lease's elector process writes too (k8s/elector_process.py); errors stay on stderr.
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = (kubeconfig, prof, scheduler_name, identity or socket.gethostname(), leader_elect, lease_namespace)

    async def until_stopped() -> None:
        """SIGTERM (the kubelet stopping the pod) stops it as Ctrl-C does: gracefully, the lease handed over."""
        main = asyncio.current_task()
        assert main is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await live.run(*args, listen, tls, trust, hami, writer, trust_configmap, elector.value, heartbeat_timeout)

    try:
        asyncio.run(until_stopped())
    except KeyboardInterrupt:
        pass
    except Exception as err:
        raise fail(f"{type(err).__name__}: {err}") from err
