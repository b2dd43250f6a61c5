"""`fairgpu simulate`: replay a scenario or trace under one or more profiles."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from fairgpu.catalog import load_profile
from fairgpu.cli.base import (
    DEFAULT_PROFILES,
    IDLE_UTILIZATION,
    TRACE_HORIZON,
    app,
    check_output,
    check_port,
    option_duration,
)
from fairgpu.cli.tables import print_comparison
from fairgpu.cli.twin import replay_recorded
from fairgpu.errors import InputError, ScenarioError
from fairgpu.framework.explain import Explanation
from fairgpu.sim import export, traces
from fairgpu.sim import report as report_mod
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim import serve as serve_mod
from fairgpu.sim.progress import replay_with_progress, status
from fairgpu.sim.runner import Simulation
from fairgpu.sim.scenario import Scenario
from fairgpu.spec import format_duration, parse_duration
from fairgpu.terminal import fail, note


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
    if kind == "fairgpu":
        return traces.load_fairgpu(Path(path))
    raise ScenarioError(f"--trace: {trace!r} must be openb:PODS.csv, philly:FILE.csv or fairgpu:TRACE.jsonl")


@app.command("simulate")
def simulate_cmd(
    scenario: Annotated[
        str | None, typer.Option(help="Built-in scenario name or YAML file.", show_default="demo")
    ] = None,
    profile: Annotated[
        list[str] | None,
        typer.Option(help="Profile name or YAML file; repeat to compare.", show_default="kube-default, fairgpu"),
    ] = None,
    trace: Annotated[
        str | None, typer.Option(help="openb:PODS.csv, philly:FILE.csv, or fairgpu:TRACE.jsonl (recorded).")
    ] = None,
    queues: Annotated[
        Path | None, typer.Option(help="With a fairgpu trace: replay it under these queues too (YAML).")
    ] = None,
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
    undeclared_durations: Annotated[
        bool,
        typer.Option(
            "--undeclared-durations",
            help="Do not tell the engine how long workloads run: it learns an estimate per queue.",
        ),
    ] = False,
) -> None:
    """Replay a scenario or trace through the engine and report fairness, utilization and waits."""
    if trace is not None and trace.startswith("fairgpu:"):
        if scenario or nodes or gpus or explain or workloads or serve:
            raise fail("--trace fairgpu:FILE goes with --queues, --profile, --horizon, --report and --json only")
        replay_recorded(trace.partition(":")[2], queues, profile or [], horizon, report, as_json)
        return
    try:
        if queues is not None:
            raise ScenarioError("--queues goes with --trace fairgpu:FILE")
        with status("loading trace" if trace else "loading scenario"):
            sc = _load_input(scenario, trace, nodes, gpus)
        h = option_duration("--horizon", horizon) if horizon is not None else None
        if h is not None and h <= 0:
            raise ScenarioError("--horizon: must be positive")
        if h is None and trace is not None:
            h = _trace_horizon(sc)
        profiles = [load_profile(p) for p in (profile or DEFAULT_PROFILES)]
        target = _parse_explain(explain, sc, h if h is not None else sc.horizon) if explain is not None else None
        for option, path in (("--report", report), ("--workloads", workloads)):
            if path is not None:
                check_output(option, path, (".csv", ".json") if option == "--workloads" else ())
        if serve:
            check_port(host, port)
    except InputError as err:
        raise fail(str(err)) from None
    if target is not None:
        _explain(sc, profiles, h, *target, as_json)
        return
    if serve:
        # one cluster in the dashboard: the profile asked for first, else the fair one
        serve_mod.serve(sc, profiles[0] if profile else load_profile("fairgpu"), h, host, port)
        return
    declared = not undeclared_durations
    results = [replay_with_progress(Simulation(sc, p, horizon=h, declared_durations=declared)) for p in profiles]
    if report is not None:
        report_mod.write(report, sc, results)
        note(f"report written to {report.resolve()}")
    if workloads is not None:
        export.write_workloads(workloads, results)
        note(f"workloads written to {workloads.resolve()}")
    for res in results:
        if res.utilization < IDLE_UTILIZATION:
            hint = " For the openb trace, `fairgpu fill` measures how well pods pack." if trace else ""
            note(
                f"warning: under {res.profile} the cluster's GPUs were {res.utilization:.1%} busy over "
                f"{format_duration(res.horizon_s)}: the load is too light to tell the profiles apart.{hint}"
            )
    if as_json:
        doc = results[0].to_json() if len(results) == 1 else {"runs": [r.to_json() for r in results]}
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    print_comparison(sc, results)


def _trace_horizon(sc: Scenario) -> float:
    """A trace replays its first TRACE_HORIZON unless told otherwise, and says so."""
    default = parse_duration(TRACE_HORIZON)
    if sc.horizon <= default:
        return sc.horizon
    note(
        f"{sc.name} spans {format_duration(sc.horizon)}; replaying its first {TRACE_HORIZON} "
        f"(--horizon {format_duration(sc.horizon)} replays all of it, which takes much longer)"
    )
    return default


def _parse_explain(spec: str, sc: Scenario, horizon: float) -> tuple[str, float]:
    name, sep, at = spec.rpartition("@")
    if not sep or not name:
        raise ScenarioError(f"--explain: {spec!r} must be WORKLOAD@TIME, e.g. b-3@2h")
    if name not in {w.name for w in sc.workloads}:
        raise ScenarioError(f"--explain: no workload named {name!r} in {sc.name}")
    t = option_duration("--explain", at)
    if t > horizon:
        raise ScenarioError(f"--explain: {at} is past the horizon ({format_duration(horizon)})")
    return name, t


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
