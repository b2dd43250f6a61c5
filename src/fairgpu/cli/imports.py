"""`fairgpu import`: other schedulers' queues as fairgpu Queues."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from fairgpu.cli.base import app
from fairgpu.errors import InputError
from fairgpu.sim import scenario as scenario_mod
from fairgpu.spec import load_yaml_all
from fairgpu.terminal import fail, note

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
        raise fail(str(err)) from None
    for line in result.notes:
        note(f"note: {line}")
    sys.stdout.write(yaml.safe_dump_all(result.queues, sort_keys=False))
