"""`simulate --report out.html`: one self-contained HTML file (inline SVG and CSS, no script, no fetch)
with the plots of one or more runs side by side, and the fill-experiment curve per policy."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fairgpu.sim.runner import SimResult
from fairgpu.sim.scenario import Scenario

POINTS = 400  # samples per plotted series: timelines have one sample per event, far more than a plot shows
COLORS = ("#2f6fde", "#f79009", "#12b76a", "#9e77ed", "#ee46bc", "#06aed4", "#f04438", "#667085")
W, H, LEFT, BOTTOM, TOP, RIGHT = 460, 236, 52, 34, 28, 12


@dataclass(slots=True)
class Series:
    label: str
    x: Sequence[float]
    y: Sequence[float]
    color: str
    dashed: bool = False
    step: bool = True  # hold each value until the next x (simulator samples); False: straight segments


def _ticks(hi: float) -> list[float]:
    if hi <= 0:
        return [0.0]
    raw = hi / 4
    mag = 10 ** np.floor(np.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return [float(v) for v in np.arange(0, hi + step * 1e-9, step)]


def line_chart(title: str, series: Sequence[Series], xlabel: str, ylabel: str, ymax: float | None = None) -> str:
    """An SVG line chart; every series shares the axes, which start at 0."""
    xs = [v for s in series for v in s.x] or [1.0]
    ys = [v for s in series for v in s.y] or [1.0]
    x_hi = max(max(xs), 1e-9)
    y_hi = ymax if ymax is not None else max(max(ys), 1e-9) * 1.05
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(v: float) -> float:
        return LEFT + pw * v / x_hi

    def py(v: float) -> float:
        return TOP + ph * (1 - v / y_hi)

    out = [
        f'<svg class="chart" viewBox="0 0 {W} {H + 16 * ((len(series) + 2) // 3)}" role="img" '
        f'aria-label="{html.escape(title)}" xmlns="http://www.w3.org/2000/svg">'
    ]
    out.append(f'<text x="{LEFT}" y="16" class="title">{html.escape(title)}</text>')
    for v in _ticks(y_hi):
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(v):.1f}" y2="{py(v):.1f}" class="grid"/>')
        out.append(f'<text x="{LEFT - 4}" y="{py(v) + 3:.1f}" text-anchor="end">{v:g}</text>')
    for v in _ticks(x_hi):
        out.append(f'<text x="{px(v):.1f}" y="{H - BOTTOM + 13}" text-anchor="middle">{v:g}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 6}" text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(
        f'<text x="12" y="{TOP + ph / 2}" transform="rotate(-90 12 {TOP + ph / 2})" '
        f'text-anchor="middle">{html.escape(ylabel)}</text>'
    )
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" class="frame"/>')
    for s in series:
        pts = []
        for i, (x, y) in enumerate(zip(s.x, s.y, strict=True)):
            if s.step and i:
                pts.append(f"{px(x):.1f},{py(s.y[i - 1]):.1f}")
            pts.append(f"{px(x):.1f},{py(y):.1f}")
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        out.append(
            f'<polyline points="{" ".join(pts)}" fill="none" stroke="{s.color}" stroke-width="1.6"{dash}>'
            f"<title>{html.escape(s.label)}</title></polyline>"
        )
    for i, s in enumerate(series):  # legend, three entries a row
        x, y = LEFT + (i % 3) * 140, H + 4 + 16 * (i // 3)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        out.append(f'<line x1="{x}" x2="{x + 18}" y1="{y}" y2="{y}" stroke="{s.color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{x + 22}" y="{y + 4}">{html.escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _resample(t: Sequence[float], values: np.ndarray, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    """Values on a regular grid (each sample holds until the next), rows of `values` matching `t`."""
    grid = np.linspace(0.0, horizon, POINTS)
    idx = np.searchsorted(np.asarray(t), grid, side="right") - 1
    held = values[np.maximum(idx, 0)]
    held[idx < 0] = 0.0  # before the first sample nothing is held
    return grid, held


def share_charts(result: SimResult, leaves: Sequence[int], names: Sequence[str]) -> list[str]:
    """One chart per leaf queue: its dominant share against its entitlement, over time."""
    tl = result.timeline
    if not tl.t:
        return []
    hours = result.horizon_s / 3600
    grid, share = _resample(tl.t, np.stack(tl.share), result.horizon_s)
    _, entitled = _resample(tl.t, np.stack(tl.entitled), result.horizon_s)
    charts = []
    for k, q in enumerate(leaves):
        color = COLORS[k % len(COLORS)]
        x = (grid / 3600).tolist()
        held = [Series("share", x, share[:, q].tolist(), color)]
        held.append(Series("entitled", x, entitled[:, q].tolist(), "#344054", True))
        top = max(1e-9, float(share[:, q].max()), float(entitled[:, q].max())) * 1.05
        title = f"{names[q]} — {result.profile}"
        charts.append(line_chart(title, held, f"hours (of {hours:g})", "dominant share", top))
    return charts


def utilization_chart(result: SimResult, total_gpus: int) -> str:
    tl = result.timeline
    grid, alloc = _resample(tl.t, np.asarray(tl.allocated_gpus, dtype=np.float64), result.horizon_s)
    util = alloc / max(1, total_gpus) * 100
    return line_chart(
        f"GPU utilization — {result.profile} (mean {100 * result.utilization:.1f} %)",
        [Series("allocated GPUs %", (grid / 3600).tolist(), util.tolist(), COLORS[0])],
        "hours",
        "% of GPUs allocated",
        ymax=100.0,
    )


def waits_by_queue(scenario: Scenario, result: SimResult, leaves: Sequence[str]) -> dict[str, np.ndarray]:
    """Submission → start of every workload submitted by the horizon, per leaf queue (a workload still
    waiting at the horizon counts the wait it has had so far, as in the run's wait percentiles)."""
    out: dict[str, list[float]] = {q: [] for q in leaves}
    for wl in scenario.workloads:
        if wl.submit_time <= result.horizon_s and wl.queue in out:
            out[wl.queue].append(result.starts.get(wl.name, result.horizon_s) - wl.submit_time)
    return {q: np.sort(np.asarray(w)) for q, w in out.items()}


def wait_chart(result: SimResult, waits: Mapping[str, np.ndarray]) -> str:
    """Empirical CDF of waits per queue: the fraction of a queue's workloads that waited at most x."""
    series = []
    for k, (q, w) in enumerate(waits.items()):
        if len(w):
            frac = np.arange(1, len(w) + 1) / len(w)
            idx = np.unique(np.linspace(0, len(w) - 1, min(len(w), POINTS)).astype(int))
            series.append(Series(q, (w[idx] / 3600).tolist(), frac[idx].tolist(), COLORS[k % len(COLORS)]))
    title = f"Wait time distribution — {result.profile}"
    return line_chart(title, series, "wait (hours)", "fraction of workloads", 1.0)


def fill_chart(curves: Mapping[str, Mapping[float, float]]) -> str:
    """The FGD fill experiment (design metrics.md): median unallocated GPU % against arrived load L %,
    one line per policy."""
    series = []
    for k, (policy, points) in enumerate(curves.items()):
        xs = sorted(points)
        series.append(Series(policy, xs, [points[x] for x in xs], COLORS[k % len(COLORS)], step=False))
    title = "Fill experiment: unallocated GPUs"
    return line_chart(title, series, "arrived GPU load L (% of capacity)", "unallocated GPU %")


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; color: #1d2330; margin: 24px; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 28px; }
.cols { display: grid; grid-template-columns: repeat(var(--cols), minmax(0, 1fr)); gap: 16px; }
svg.chart { width: 100%; max-width: 560px; font-size: 11px; fill: #475467; }
svg .grid { stroke: #eaecf0; } svg .title { font-size: 13px; font-weight: 600; fill: #1d2330; }
svg .frame { fill: none; stroke: #98a2b3; }
table { border-collapse: collapse; } th, td { border: 1px solid #d0d5dd; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
"""


def _table(results: Sequence[SimResult]) -> str:
    def cell(v: float | None, spec: str) -> str:
        return "—" if v is None else format(v, spec)

    rows = [
        ("GPU utilization", [f"{r.utilization:.1%}" for r in results]),
        ("fairness error (0 = fair)", [f"{r.fairness_error:.3f}" for r in results]),
        ("Jain index (1 = fair)", [cell(r.jain_index, ".3f") for r in results]),
        ("evictions", [str(r.evictions) for r in results]),
        *((f"idle GPU-hours: {c}", [f"{r.idle_gpu_hours[c]:.1f}" for r in results]) for c in results[0].idle_gpu_hours),
    ]
    head = "".join(f"<th>{html.escape(r.profile)}</th>" for r in results)
    body = "".join(f"<tr><td>{k}</td>{''.join(f'<td>{v}</td>' for v in vs)}</tr>" for k, vs in rows)
    return f'<table class="summary"><tr><th>metric</th>{head}</tr>{body}</table>'


def render(
    scenario: Scenario, results: Sequence[SimResult], fill: Mapping[str, Mapping[float, float]] | None = None
) -> str:
    """The report's HTML: one column per run, so two profiles read side by side."""
    tree = scenario.tree()
    names = tree.names()
    total_gpus = sum(len(n.gpus) for n in scenario.nodes)
    cols = len(results)

    def row(title: str, per_run: list[str]) -> str:
        cells = "".join(
            f'<div class="run"><h3>{html.escape(r.profile)}</h3>{c}</div>'
            for r, c in zip(results, per_run, strict=True)
        )
        return f'<h2>{html.escape(title)}</h2><div class="cols" style="--cols:{cols}">{cells}</div>'

    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f"<title>fairgpu report — {html.escape(scenario.name)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>fairgpu simulation report — {html.escape(scenario.name)}</h1>",
        f"<p>{html.escape(scenario.description or '')}</p>" if scenario.description else "",
        f"<p>{len(scenario.nodes)} nodes, {total_gpus} GPUs.</p>",
        _table(results) if results else "",
    ]
    if results:
        shares = ["\n".join(share_charts(r, tree.leaves, names)) for r in results]
        parts.append(row("Share vs entitlement per queue", shares))
        parts.append(row("Utilization", [utilization_chart(r, total_gpus) for r in results]))
        leaves = tree.leaf_names()
        parts.append(row("Wait times per queue", [wait_chart(r, waits_by_queue(scenario, r, leaves)) for r in results]))
    if fill:
        parts.append(f"<h2>Fill experiment</h2>{fill_chart(fill)}")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def write(path: Path, scenario: Scenario, results: Sequence[SimResult]) -> None:
    path.write_text(render(scenario, results), encoding="utf-8")
