"""The `fairgpu` command."""

from __future__ import annotations

import json
import os
import socket
import sys
from importlib import metadata
from importlib import resources as pkg_resources
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from fairgpu.catalog import builtin_profiles, load_profile
from fairgpu.errors import FairgpuError, InputError, ScenarioError
from fairgpu.framework.explain import Explanation
from fairgpu.framework.placement import UNPLACED_CAUSES
from fairgpu.k8s.identity import FAIRGPU_SA
from fairgpu.sim import export, fill, traces
from fairgpu.sim import report as report_mod
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim import serve as serve_mod
from fairgpu.sim.progress import replay_with_progress, status
from fairgpu.sim.runner import SimResult, Simulation
from fairgpu.sim.scenario import Scenario
from fairgpu.spec import format_duration, load_yaml, load_yaml_all, parse_duration

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Fair-share GPU scheduling for Kubernetes.",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)
DEFAULT_PROFILES = ("kube-default", "fairgpu")
TRACE_HORIZON = "14d"  # a trace's default window: the whole Philly trace (~125 days) takes ~25 minutes
MAX_SEEDS = 1000
IDLE_UTILIZATION = 0.05  # below this a replay says the cluster sat mostly idle


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _note(message: str) -> None:
    Console(stderr=True).print(escape(message), highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"fairgpu {metadata.version('fairgpu')}\n")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Fair-share GPU scheduling for Kubernetes."""


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
    scenario: Annotated[
        str | None, typer.Option(help="Built-in scenario name or YAML file.", show_default="demo")
    ] = None,
    profile: Annotated[
        list[str] | None,
        typer.Option(help="Profile name or YAML file; repeat to compare.", show_default="kube-default, fairgpu"),
    ] = None,
    trace: Annotated[str | None, typer.Option(help="openb:PODS.csv or philly:FILE.csv")] = None,
    nodes: Annotated[Path | None, typer.Option(help="Node CSV for an openb trace.")] = None,
    gpus: Annotated[int | None, typer.Option(help="Cluster size in GPUs for a philly trace.")] = None,
    horizon: Annotated[
        str | None,
        typer.Option(
            help="How far to replay (e.g. 14d, 1h30m).",
            show_default=f"the scenario's; {TRACE_HORIZON} for a trace",
        ),
    ] = None,
    explain: Annotated[
        str | None, typer.Option(help="WORKLOAD@TIME: why that workload is pending at that time (e.g. b-3@2h).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")] = False,
    report: Annotated[Path | None, typer.Option(help="Also write a self-contained HTML report with plots.")] = None,
    workloads: Annotated[
        Path | None, typer.Option(help="Also write one row per workload and profile (FILE.csv or FILE.json).")
    ] = None,
    serve: Annotated[bool, typer.Option("--serve", help="Replay into the web dashboard (first profile).")] = False,
    host: Annotated[str, typer.Option(help="Dashboard address, with --serve.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Dashboard port, with --serve.")] = 8080,
) -> None:
    """Replay a scenario or trace through the engine and report fairness, utilization and waits."""
    try:
        with status("loading trace" if trace else "loading scenario"):
            sc = _load_input(scenario, trace, nodes, gpus)
        h = _option_duration("--horizon", horizon) if horizon is not None else None
        if h is not None and h <= 0:
            raise ScenarioError("--horizon: must be positive")
        if h is None and trace is not None:
            h = _trace_horizon(sc)
        profiles = [load_profile(p) for p in (profile or DEFAULT_PROFILES)]
        target = _parse_explain(explain, sc, h if h is not None else sc.horizon) if explain is not None else None
        for option, path in (("--report", report), ("--workloads", workloads)):
            if path is not None:
                _check_output(option, path, (".csv", ".json") if option == "--workloads" else ())
        if serve:
            _check_port(host, port)
    except InputError as err:
        raise _fail(str(err)) from None
    if target is not None:
        _explain(sc, profiles, h, *target, as_json)
        return
    if serve:
        # one cluster in the dashboard: the profile asked for first, else the fair one
        serve_mod.serve(sc, profiles[0] if profile else load_profile("fairgpu"), h, host, port)
        return
    results = [replay_with_progress(Simulation(sc, p, horizon=h)) for p in profiles]
    if report is not None:
        report_mod.write(report, sc, results)
        _note(f"report written to {report.resolve()}")
    if workloads is not None:
        export.write_workloads(workloads, results)
        _note(f"workloads written to {workloads.resolve()}")
    for res in results:
        if res.utilization < IDLE_UTILIZATION:
            hint = " For the openb trace, `fairgpu fill` measures how well pods pack." if trace else ""
            _note(
                f"warning: under {res.profile} the cluster's GPUs were {res.utilization:.1%} busy over "
                f"{format_duration(res.horizon_s)}: the load is too light to tell the profiles apart.{hint}"
            )
    if as_json:
        doc = results[0].to_json() if len(results) == 1 else {"runs": [r.to_json() for r in results]}
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    _print_comparison(sc, results)


def _trace_horizon(sc: Scenario) -> float:
    """A trace replays its first TRACE_HORIZON unless told otherwise, and says so."""
    default = parse_duration(TRACE_HORIZON)
    if sc.horizon <= default:
        return sc.horizon
    _note(
        f"{sc.name} spans {format_duration(sc.horizon)}; replaying its first {TRACE_HORIZON} "
        f"(--horizon {format_duration(sc.horizon)} replays all of it, which takes much longer)"
    )
    return default


def _check_output(option: str, path: Path, suffixes: tuple[str, ...]) -> None:
    """Before a long run, not after it: the folder must exist and be writable."""
    if suffixes and path.suffix not in suffixes:
        raise ScenarioError(f"{option}: {path} must end in {' or '.join(suffixes)}")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ScenarioError(f"{option}: folder {folder} does not exist")
    if path.is_dir():
        raise ScenarioError(f"{option}: {path} is a folder; give a file name")
    if not os.access(folder, os.W_OK):
        raise ScenarioError(f"{option}: folder {folder} is not writable")


def _check_port(host: str, port: int, option: str = "--port") -> None:
    """A bad or busy port is refused before anything starts (uvicorn would fail after the banner)."""
    if not 0 < port < 65536:
        raise ScenarioError(f"{option}: {port} is not a port number (1-65535)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise ScenarioError(f"--host: {host!r} is not an address of this machine") from None
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as err:
            raise ScenarioError(f"{option}: cannot listen on {host}:{port}: {err.strerror}") from None


def _parse_explain(spec: str, sc: Scenario, horizon: float) -> tuple[str, float]:
    name, sep, at = spec.rpartition("@")
    if not sep or not name:
        raise ScenarioError(f"--explain: {spec!r} must be WORKLOAD@TIME, e.g. b-3@2h")
    if name not in {w.name for w in sc.workloads}:
        raise ScenarioError(f"--explain: no workload named {name!r} in {sc.name}")
    t = _option_duration("--explain", at)
    if t > horizon:
        raise ScenarioError(f"--explain: {at} is past the horizon ({format_duration(horizon)})")
    return name, t


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
        console.print(f"[bold]{doc['profile']}[/] at t={format_duration(at)}", highlight=False)
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
    if not console.is_terminal:  # a pipe or file: no need to squeeze into 80 columns
        console = Console(width=120)
    console.print(f"[bold]{sc.name}[/] — {sc.description}" if sc.description else f"[bold]{sc.name}[/]")
    summary = Table(title=f"Run over {results[0].horizon_s / 3600:g} h", title_justify="left")
    summary.add_column("metric")
    for res in results:
        summary.add_column(res.profile, justify="right")
    summary.add_row("GPU utilization", *[f"{r.utilization:.1%}" for r in results])
    summary.add_row("fairness error (0 = fair)", *[f"{r.fairness_error:.3f}" for r in results])
    summary.add_row("Jain index (1 = fair)", *[_fmt(r.jain_index, ".3f") for r in results])
    summary.add_row("evictions", *[str(r.evictions) for r in results])
    for cause in results[0].idle_gpu_hours:
        summary.add_row(f"idle GPU-hours: {cause}", *[f"{r.idle_gpu_hours[cause]:.1f}" for r in results])
    console.print(summary)
    queues = Table(
        title="Per queue",
        title_justify="left",
        caption="held: share of GPUs held while others waited; started: of submitted; never: never started",
        caption_justify="left",
    )
    for col in ("queue", "profile", "GPU-h", "entitled", "held", "wait p95", "started", "never", "preempted"):
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
                f"{q['submitted'] - q['never_started']}/{q['submitted']}",
                str(q["never_started"]),
                str(q["preempted"]),
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
    """`42-51` or `42,43,50`: each seed once, at most MAX_SEEDS of them."""
    seeds: list[int] = []
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ScenarioError(f"--seeds: {part.strip()!r} must be a seed (42) or a range (42-51)")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise ScenarioError(f"--seeds: {part.strip()!r} runs backwards")
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise ScenarioError(f"--seeds: {spec!r} names more than {MAX_SEEDS} seeds")
        for seed in range(first, last + 1):
            if seed in seeds:
                raise ScenarioError(f"--seeds: seed {seed} is named twice")
            seeds.append(seed)
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
    except InputError as err:
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


scenarios_app = typer.Typer(help="The built-in scenarios.", invoke_without_command=True)
app.add_typer(scenarios_app, name="scenarios")


@scenarios_app.callback()
def scenarios_cmd(ctx: typer.Context) -> None:
    """List the built-in scenarios (`scenarios show NAME` prints one to start from)."""
    if ctx.invoked_subcommand is not None:
        return
    table = Table("scenario", "what it shows")
    for name, desc in scenario_mod.builtin_scenarios().items():
        table.add_row(name, desc)
    Console().print(table)


@scenarios_app.command("show")
def scenarios_show_cmd(name: Annotated[str, typer.Argument(help="A built-in scenario.")]) -> None:
    """Print a built-in scenario's YAML, a template for your own (`> mine.yaml`)."""
    known = scenario_mod.builtin_scenarios()
    if name not in known:
        raise _fail(f"scenarios show: no built-in scenario {name!r} (known: {', '.join(known)})")
    sys.stdout.write((pkg_resources.files("fairgpu") / "sim" / "scenarios" / f"{name}.yaml").read_text())


@app.command("validate")
def validate_cmd(
    file: Annotated[Path, typer.Argument(help="A scenario or profile YAML file.")],
) -> None:
    """Check a scenario or profile file without running it: `ok` and a summary, or one error line."""
    try:
        text = scenario_mod.read_text(file)
        doc = load_yaml(text, str(file))
        if isinstance(doc, dict) and "cluster" not in doc and {"queueSort", "filter", "score"} & set(doc):
            prof = load_profile(str(file))
            sys.stdout.write(f"ok: profile {prof.name}\n")
            return
        sc = scenario_mod.build(doc)
    except InputError as err:
        raise _fail(str(err)) from None
    gpus = sum(len(n.gpus) for n in sc.nodes)
    sys.stdout.write(
        f"ok: scenario {sc.name}: {len(sc.nodes)} nodes ({gpus} GPUs), {len(sc.queues)} queues, "
        f"{len(sc.workloads)} workloads over {format_duration(sc.horizon)}\n"
    )


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
    hami_config: Annotated[
        str | None,
        typer.Option(help="HAMi's device config (device-config.yaml or its ConfigMap): names, defaults, lock expiry."),
    ] = None,
) -> None:
    """Schedule pods on a live cluster (secondary scheduler, HAMi enforcement)."""
    import asyncio
    import logging
    import socket

    from fairgpu.k8s import app as live
    from fairgpu.k8s.identity import DEFAULT_CONTROLLERS, Trust
    from fairgpu.k8s.kubeconfig import check_kubeconfig

    try:
        prof = load_profile(profile)
    except InputError as err:
        raise _fail(f"--profile: {err}") from err
    from fairgpu import hamiconfig

    try:
        hami = hamiconfig.load(hami_config) if hami_config else hamiconfig.DEFAULT
    except InputError as err:
        raise _fail(f"--hami-config: {err}") from err
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
        check_kubeconfig(kubeconfig)  # after the addresses, so an unsafe exposure is named first
    except FairgpuError as err:
        raise _fail(str(err)) from err
    trust = Trust.of(service_account, trusted_identity or (), pod_controller or DEFAULT_CONTROLLERS)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = (kubeconfig, prof, scheduler_name, identity or socket.gethostname(), leader_elect, lease_namespace)
    try:
        asyncio.run(live.run(*args, listen, tls, trust, hami))
    except KeyboardInterrupt:
        pass
    except Exception as err:
        raise _fail(f"{type(err).__name__}: {err}") from err


import_app = typer.Typer(help="Turn another scheduler's queues into fairgpu Queue resources.", no_args_is_help=True)
app.add_typer(import_app, name="import")


@import_app.command("kueue")
def import_kueue_cmd(
    file: Annotated[Path, typer.Argument(help="YAML with Kueue ClusterQueues, Cohorts and LocalQueues.")],
) -> None:
    """Print Queue resources for Kueue's queues (`| kubectl apply -f -`); one line on stderr per field that
    has no fairgpu meaning."""
    from fairgpu.k8s.kueue import import_kueue

    try:
        text = scenario_mod.read_text(file)
        docs = load_yaml_all(text, str(file))
        result = import_kueue(docs, file.name)
    except InputError as err:
        raise _fail(str(err)) from None
    for note in result.notes:
        _note(f"note: {note}")
    sys.stdout.write(yaml.safe_dump_all(result.queues, sort_keys=False))


def _kubectl_commands() -> None:
    """`fairgpu queues|workloads|why|top`: the kubectl plugin's commands, under the main command too."""
    from fairgpu.k8s import kubectl

    app.registered_commands.extend(kubectl.app.registered_commands)


_kubectl_commands()

if __name__ == "__main__":  # pragma: no cover
    app()
