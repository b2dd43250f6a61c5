"""The `fairgpu` command."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from fairgpu.catalog import builtin_profiles, load_profile
from fairgpu.errors import FairgpuError, ProfileError, ScenarioError
from fairgpu.framework.explain import Explanation
from fairgpu.framework.placement import UNPLACED_CAUSES
from fairgpu.k8s.identity import FAIRGPU_SA
from fairgpu.sim import fill, traces
from fairgpu.sim import report as report_mod
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim import serve as serve_mod
from fairgpu.sim.runner import SimResult, Simulation
from fairgpu.sim.scenario import Scenario
from fairgpu.spec import parse_duration

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Fair-share GPU scheduling for Kubernetes.")
DEFAULT_PROFILES = ("kube-default", "fairgpu")


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _load_input(scenario: str | None, trace: str | None, nodes: Path | None, gpus: int | None) -> Scenario:
    if trace is None:
        if nodes is not None or gpus is not None:
            raise ScenarioError("--nodes and --gpus go with --trace")
        return scenario_mod.load(scenario or "demo")
    if scenario is not None:
        raise ScenarioError("give --scenario or --trace, not both")
    kind, _, path = trace.partition(":")
    if kind == "openb":
        if nodes is None:
            raise ScenarioError("--trace openb:PODS.csv needs --nodes NODES.csv")
        return traces.load_openb(Path(path), nodes)
    if kind == "philly":
        if gpus is None:
            raise ScenarioError("--trace philly:FILE.csv needs --gpus N")
        return traces.load_philly(Path(path), gpus)
    raise ScenarioError(f"--trace: {trace!r} must be openb:PODS.csv or philly:FILE.csv")


@app.command("simulate")
def simulate_cmd(
    scenario: Annotated[str | None, typer.Option(help="Built-in scenario name or YAML file.")] = None,
    profile: Annotated[list[str] | None, typer.Option(help="Profile name or YAML file; repeat to compare.")] = None,
    trace: Annotated[str | None, typer.Option(help="openb:PODS.csv or philly:FILE.csv")] = None,
    nodes: Annotated[Path | None, typer.Option(help="Node CSV for an openb trace.")] = None,
    gpus: Annotated[int | None, typer.Option(help="Cluster size in GPUs for a philly trace.")] = None,
    horizon: Annotated[str | None, typer.Option(help="Override the horizon (e.g. 14d).")] = None,
    explain: Annotated[
        str | None, typer.Option(help="WORKLOAD@TIME: why that workload is pending at that time (e.g. b-3@2h).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    report: Annotated[Path | None, typer.Option(help="Also write a self-contained HTML report with plots.")] = None,
    serve: Annotated[bool, typer.Option("--serve", help="Replay into the web dashboard (first profile).")] = False,
    host: Annotated[str, typer.Option(help="Dashboard address, with --serve.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Dashboard port, with --serve.")] = 8080,
) -> None:
    """Replay a scenario or trace through the engine and report fairness, utilization and waits."""
    try:
        sc = _load_input(scenario, trace, nodes, gpus)
        h = _option_duration("--horizon", horizon) if horizon is not None else None
        if h is not None and h <= 0:
            raise ScenarioError("--horizon: must be positive")
        profiles = [load_profile(p) for p in (profile or DEFAULT_PROFILES)]
        target = _parse_explain(explain, sc) if explain is not None else None
    except (ScenarioError, ProfileError, ValueError) as err:
        raise _fail(str(err)) from None
    if target is not None:
        _explain(sc, profiles, h, *target, as_json)
        return
    if serve:
        # one cluster in the dashboard: the profile asked for first, else the fair one
        serve_mod.serve(sc, profiles[0] if profile else load_profile("fairgpu"), h, host, port)
        return
    results = [Simulation(sc, p, horizon=h).run() for p in profiles]
    if report is not None:
        report_mod.write(report, sc, results)
    if as_json:
        doc = results[0].to_json() if len(results) == 1 else {"runs": [r.to_json() for r in results]}
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    _print_comparison(sc, results)


def _parse_explain(spec: str, sc: Scenario) -> tuple[str, float]:
    name, sep, at = spec.rpartition("@")
    if not sep or not name:
        raise ScenarioError(f"--explain: {spec!r} must be WORKLOAD@TIME, e.g. b-3@2h")
    if name not in {w.name for w in sc.workloads}:
        raise ScenarioError(f"--explain: no workload named {name!r} in {sc.name}")
    return name, _option_duration("--explain", at)


def _option_duration(option: str, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as err:
        raise ScenarioError(f"{option}: {err}") from None


def _explain(sc: Scenario, profiles: list, horizon: float | None, name: str, at: float, as_json: bool) -> None:
    docs = []
    for prof in profiles:
        sim = Simulation(sc, prof, horizon=horizon)
        sim.run_until(at)
        try:
            exp = sim.sched.explain(name, at)
        except KeyError:
            state = "finished" if name in sim.starts else "not submitted yet"
            docs.append({"profile": prof.name, "workload": name, "state": state})
            continue
        docs.append({"profile": prof.name, **exp.to_json()})
    if as_json:
        sys.stdout.write(json.dumps(docs[0] if len(docs) == 1 else {"explanations": docs}) + "\n")
        return
    console = Console()
    for doc in docs:
        console.print(f"[bold]{doc['profile']}[/] at t={at:g}s", highlight=False)
        if "reasons" not in doc:
            console.print(f"workload {name}: {doc['state']}", highlight=False)
            continue
        exp = Explanation(**{k: v for k, v in doc.items() if k != "profile"})
        for line in exp.lines():
            console.print(escape(line), highlight=False)


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _print_comparison(sc: Scenario, results: list[SimResult]) -> None:
    console = Console()
    console.print(f"[bold]{sc.name}[/] — {sc.description}" if sc.description else f"[bold]{sc.name}[/]")
    summary = Table(title=f"Run over {results[0].horizon_s / 3600:g} h", title_justify="left")
    summary.add_column("metric")
    for res in results:
        summary.add_column(res.profile, justify="right")
    summary.add_row("GPU utilization", *[f"{r.utilization:.1%}" for r in results])
    summary.add_row("fairness error (0 = fair)", *[f"{r.fairness_error:.3f}" for r in results])
    summary.add_row("Jain index (1 = fair)", *[_fmt(r.jain_index, ".3f") for r in results])
    summary.add_row("evictions", *[str(r.evictions) for r in results])
    console.print(summary)
    queues = Table(title="Per queue", title_justify="left")
    for col in ("queue", "profile", "GPU-hours", "entitled", "held while others wait", "wait p95"):
        queues.add_column(col, justify="left" if col in ("queue", "profile") else "right")
    for name in results[0].queues:
        for i, res in enumerate(results):
            q = res.queues[name]
            queues.add_row(
                name if i == 0 else "",
                res.profile,
                f"{q['gpu_hours']:.0f}",
                f"{q['entitled_gpu_hours']:.0f}",
                _fmt(q["share_while_others_wait"], ".0%"),
                _fmt_wait(q["wait_p95_s"]),
                end_section=i == len(results) - 1,
            )
    console.print(queues)


def _fmt_wait(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _parse_seeds(spec: str) -> list[int]:
    """`42-51` or `42,43,50`."""
    try:
        seeds: list[int] = []
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            seeds.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    except ValueError:
        raise ScenarioError(f"--seeds: {spec!r} must be like 42-51 or 42,43") from None
    if not seeds:
        raise ScenarioError(f"--seeds: {spec!r} names no seed")
    return seeds


@app.command("fill")
def fill_cmd(
    nodes: Annotated[Path, typer.Option(help="openb node CSV (sn,cpu_milli,memory_mib,gpu,model).")],
    pods: Annotated[Path, typer.Option(help="openb pod CSV; time columns are ignored.")],
    policy: Annotated[str, typer.Option(help=f"Comma-separated: {', '.join(fill.POLICIES)}.")] = "fairgpu",
    seeds: Annotated[str, typer.Option(help="Seeds, e.g. 42-51 or 42,43.")] = "42-51",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
) -> None:
    """The FGD fill experiment: unallocated GPU % against arrived load, median (min-max) over seeds."""
    try:
        policies = [p.strip() for p in policy.split(",") if p.strip()]
        if not policies:
            raise ScenarioError("--policy: names no policy")
        seed_list = _parse_seeds(seeds)
        # on stderr, so that --json output stays one clean document; gone once the runs are done
        with Progress(*Progress.get_default_columns(), console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("fill runs (policy × seed)", total=len(policies) * len(seed_list))
            doc = fill.fill_experiment(
                nodes, pods, policies, seed_list, progress=lambda done, _: bar.update(task, completed=done)
            )
    except (ScenarioError, ProfileError, ValueError) as err:
        raise _fail(str(err)) from None
    if as_json:
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    table = Table("load %", *policies, title="unallocated GPU %: median (min-max) over seeds")
    for load in fill.LOADS:
        cells = []
        for p in policies:
            c = doc["policies"][p]["unallocated_gpu_pct"].get(str(load))
            cells.append(f"{c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f})" if c else "-")
        table.add_row(str(load), *cells)
    Console().print(table)
    for load in fill.CAUSE_LOADS:
        why = Table("cause", *policies, title=f"failed up to {load} % load, by cause: pods (GPUs), median over seeds")
        for cause in UNPLACED_CAUSES:
            got = [doc["policies"][p]["failed_by_cause"][str(load)].get(cause) for p in policies]
            if any(got):
                why.add_row(cause, *(f"{c['pods']:g} ({c['gpus']:.1f})" if c else "0" for c in got))
        Console().print(why)


@app.command("scenarios")
def scenarios_cmd() -> None:
    """List the built-in scenarios."""
    table = Table("scenario", "what it shows")
    for name, desc in scenario_mod.builtin_scenarios().items():
        table.add_row(name, desc)
    Console().print(table)


@app.command("profiles")
def profiles_cmd() -> None:
    """List the built-in profiles."""
    table = Table("profile", "what it does")
    for name in builtin_profiles():
        table.add_row(name, " ".join(load_profile(name).description.split()))
    Console().print(table)


@app.command("run")
def run_cmd(
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig file; without it, the pod's in-cluster service account.")
    ] = None,
    profile: Annotated[str, typer.Option(help="Profile name or YAML file.")] = "fairgpu",
    scheduler_name: Annotated[str, typer.Option(help="Pods with this spec.schedulerName are ours.")] = "fairgpu",
    leader_elect: Annotated[bool, typer.Option(help="Elect a leader on a Lease (run several replicas).")] = True,
    lease_namespace: Annotated[str, typer.Option(help="Namespace of the leader Lease.")] = "fairgpu-system",
    identity: Annotated[str | None, typer.Option(help="This replica's name in the Lease (default: hostname).")] = None,
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
    pod_controller: Annotated[
        list[str] | None,
        typer.Option(help="A user that makes pods from templates, whose pods keep the template's user; repeatable."),
    ] = None,
) -> None:
    """Schedule pods on a live cluster (secondary scheduler, HAMi enforcement)."""
    import asyncio
    import logging
    import socket

    from fairgpu.k8s import app as live
    from fairgpu.k8s.identity import DEFAULT_CONTROLLERS, Trust

    try:
        prof = load_profile(profile)
    except ProfileError as err:
        raise _fail(f"--profile: {err}") from err
    if (tls_cert is None) != (tls_key is None):
        raise _fail("--tls-cert and --tls-key go together")
    tls = (tls_cert, tls_key) if tls_cert and tls_key else None
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
    except FairgpuError as err:
        raise _fail(str(err)) from err
    trust = Trust.of(service_account, trusted_identity or (), pod_controller or DEFAULT_CONTROLLERS)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = (kubeconfig, prof, scheduler_name, identity or socket.gethostname(), leader_elect, lease_namespace)
    try:
        asyncio.run(live.run(*args, listen, tls, trust))
    except KeyboardInterrupt:
        pass
    except Exception as err:
        raise _fail(f"{type(err).__name__}: {err}") from err


if __name__ == "__main__":  # pragma: no cover
    app()
