"""Progress on stderr for the simulator's long steps (trace loading, replays): a live bar on a terminal,
nothing when stderr is a pipe or a file, so --json output and logs stay clean."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fairgpu.sim.runner import SimResult, Simulation
from fairgpu.spec import format_duration

STEPS = 200  # a replay advances in this many slices of simulated time, one bar update each


def _console() -> Console:
    return Console(stderr=True)


@contextmanager
def status(what: str) -> Iterator[None]:
    """A spinner with the time spent, while one step whose length is unknown runs."""
    console = _console()
    if not console.is_terminal:
        yield
        return
    columns = (SpinnerColumn(), TextColumn(what), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as spinner:
        spinner.add_task(what, total=None)
        yield


def replay_with_progress(sim: Simulation) -> SimResult:
    """Run a simulation to its horizon, showing simulated time against the horizon and the time left."""
    console = _console()
    if not console.is_terminal:
        return sim.run()
    horizon = sim.horizon
    columns = (
        TextColumn(f"{sim.profile.name}: replaying {format_duration(horizon)}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("replay", total=STEPS)
        for step in range(1, STEPS + 1):
            sim.run_until(horizon * step / STEPS)
            bar.update(task, completed=step)
    return sim.run()
