"""The digital twin's commands: `record` (a trace of the cluster from a workstation), and replaying a recorded
trace beside what the cluster did (`simulate --trace fairgpu:FILE` lands here)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from fairgpu.catalog import builtin_profiles, load_profile
from fairgpu.cli.base import app, check_output, option_duration
from fairgpu.errors import InputError, ScenarioError
from fairgpu.sim import report as report_mod
from fairgpu.sim import twin
from fairgpu.sim.progress import replay_with_progress, status
from fairgpu.sim.recorded import read_fairgpu
from fairgpu.sim.runner import Simulation
from fairgpu.terminal import fail, note
from fairgpu.twin.writer import TraceWriter


@app.command("record")
def record_cmd(
    out: Annotated[Path, typer.Argument(help="The trace file (JSON lines, docs/twin.md).")],
    kubeconfig: Annotated[str | None, typer.Option(help="kubeconfig file; without it, the in-cluster account.")] = None,
    scheduler_name: Annotated[str, typer.Option(help="Record the pods with this spec.schedulerName.")] = "fairgpu",
    record_max_mb: Annotated[float, typer.Option(help="Rotate the trace past this size.")] = 100.0,
    record_keep: Annotated[int, typer.Option(help="Rotated traces kept (FILE.1 … FILE.N).")] = 3,
) -> None:
    """Record what the cluster's scheduler sees (nodes, queues, arrivals, starts, ends) to a trace, scheduling
    nothing, until interrupted; replay it with `simulate --trace fairgpu:FILE --profile P`."""
    import asyncio

    from fairgpu.k8s.client import KubeClient
    from fairgpu.k8s.kubeconfig import check_kubeconfig
    from fairgpu.k8s.recording import Watcher

    try:
        check_kubeconfig(kubeconfig)
        writer = TraceWriter(out, int(record_max_mb * (1 << 20)), record_keep, "OUT")
    except InputError as err:
        raise fail(str(err)) from err

    async def go() -> None:
        port = await KubeClient.connect(kubeconfig)
        try:
            await Watcher(port, writer, scheduler_name).run()
        finally:
            await port.close()

    note(f"recording to {out.resolve()}; Ctrl-C stops")
    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        pass
    except Exception as err:
        raise fail(f"{type(err).__name__}: {err}") from err
    finally:
        writer.close()


def replay_recorded(
    path: str, queues: Path | None, profiles: list[str], horizon: str | None, report: Path | None, as_json: bool
) -> None:
    """A recorded trace: the cluster's own run beside the replays (twin.plan), per queue."""
    try:
        with status("loading trace"):
            trace = read_fairgpu(Path(path))
        if trace.profile not in builtin_profiles() and not profiles:
            raise ScenarioError(f"--profile: the trace's profile {trace.profile!r} is not a built-in; name one")
        base = load_profile(trace.profile if trace.profile in builtin_profiles() else profiles[0])
        plans = twin.plan(trace, base, [load_profile(p) for p in profiles], queues)
        h = option_duration("--horizon", horizon) if horizon is not None else trace.scenario.horizon
        if h <= 0:
            raise ScenarioError("--horizon: must be positive")
        if report is not None:
            check_output("--report", report, ())
    except InputError as err:
        raise fail(str(err)) from None
    for line in trace.notes:
        note(f"note: {line}")
    results = [replay_with_progress(Simulation(p.scenario, p.profile, horizon=h)) for p in plans]
    results = [replace(res, profile=p.label) for res, p in zip(results, plans, strict=True)]
    if report is not None:
        report_mod.write(report, trace.scenario, results)
        note(f"report written to {report.resolve()}")
    columns = [twin.recorded(trace, h), *(twin.replayed(r.profile, r) for r in results)]
    if as_json:
        doc = {
            "trace": path,
            "columns": [
                {"label": c.label, "queues": c.queues, "evictions": c.evictions, "utilization": c.utilization}
                for c in columns
            ],
            "runs": [r.to_json() for r in results],
        }
        sys.stdout.write(json.dumps(doc) + "\n")
        return
    console = Console() if Console().is_terminal else Console(width=140)
    console.print(f"[bold]{escape(trace.scenario.name)}[/] — {escape(trace.scenario.description)}")
    console.print(twin.table(columns, h))
