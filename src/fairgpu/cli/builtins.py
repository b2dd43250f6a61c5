"""`fairgpu scenarios`, `profiles` and `validate`: what is built in, and checking a file."""

from __future__ import annotations

import sys
from importlib import resources as pkg_resources
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fairgpu.catalog import builtin_profiles, load_profile
from fairgpu.cli.base import app
from fairgpu.errors import InputError
from fairgpu.sim import scenario as scenario_mod
from fairgpu.spec import format_duration, load_yaml
from fairgpu.terminal import fail

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
        raise fail(f"scenarios show: no built-in scenario {name!r} (known: {', '.join(known)})")
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
        raise fail(str(err)) from None
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
