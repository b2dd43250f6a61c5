"""The terminal tables of `fairgpu simulate`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from fairgpu.sim.runner import SimResult
from fairgpu.sim.scenario import Scenario


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def print_comparison(sc: Scenario, results: list[SimResult]) -> None:
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
