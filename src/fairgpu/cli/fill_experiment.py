"""`fairgpu fill`: the FGD fill experiment."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from fairgpu.cli.base import MAX_SEEDS, app
from fairgpu.errors import InputError, ScenarioError
from fairgpu.framework.placement import UNPLACED_CAUSES
from fairgpu.sim import fill
from fairgpu.terminal import fail


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
        raise fail(str(err)) from None
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
