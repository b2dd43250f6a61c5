"""`simulate --report out.html`: one self-contained HTML file (the vendored Vega-Lite inlined, no fetch)
with the runs' charts and tables, and the fill-experiment curve per policy.

Why Vega-Lite: a chart is a declarative spec built here from the results, so axes, ticks, legends and
tooltips come from the library and tests can read the specs; the same library draws the dashboard. Runs of
different profiles share one facet, hence one scale: by-eye comparison between columns is honest."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fairgpu import resources as r
from fairgpu.sim.runner import SimResult
from fairgpu.sim.scenario import Scenario

POINTS = 400  # samples per plotted series: timelines have one sample per event, far more than a plot shows
VENDOR = Path(__file__).resolve().parent.parent / "observe" / "static" / "vendor"
LIBRARIES = ("vega.min.js", "vega-lite.min.js", "vega-embed.min.js")
WIDTH, HEIGHT = 420, 150

Spec = dict[str, Any]


def _resample(t: Sequence[float], values: np.ndarray, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    """Values on a regular grid (each sample holds until the next), rows of `values` matching `t`."""
    grid = np.linspace(0.0, horizon, POINTS)
    idx = np.searchsorted(np.asarray(t), grid, side="right") - 1
    held = values[np.maximum(idx, 0)]
    held[idx < 0] = 0.0  # before the first sample nothing is held
    return grid, held


def gpus_chart(scenario: Scenario, results: Sequence[SimResult]) -> Spec:
    """GPUs each leaf queue held against its fair share, guarantee and limit: a row per queue, a column
    per profile, one y scale for all of them."""
    tree = scenario.tree()
    names = tree.names()
    rows: list[dict[str, Any]] = []
    rules: list[dict[str, Any]] = []
    for res in results:
        tl = res.timeline
        if not tl.t:
            continue
        grid, held = _resample(tl.t, np.stack(tl.gpus), res.horizon_s)
        _, owed = _resample(tl.t, np.stack(tl.entitled_gpus), res.horizon_s)
        hours = np.round(grid / 3600, 4).tolist()
        for q in tree.leaves:
            for series, values in (("held", held[:, q]), ("fair share", owed[:, q])):
                rows += [
                    {
                        "kind": "series",
                        "profile": res.profile,
                        "queue": names[q],
                        "series": series,
                        "hours": h,
                        "gpus": round(v, 3),
                    }
                    for h, v in zip(hours, values.tolist(), strict=True)
                ]
            spec = tree.queues[q]
            for line, value in (("guarantee", spec.guaranteed[r.DIM_GPU]), ("limit", spec.limit[r.DIM_GPU])):
                if np.isfinite(value) and value > 0:
                    rules.append(
                        {
                            "kind": "rule",
                            "profile": res.profile,
                            "queue": names[q],
                            "series": line,
                            "gpus": float(value),
                        }
                    )
    color = {
        "field": "series",
        "type": "nominal",
        "title": None,
        "scale": {
            "domain": ["held", "fair share", "guarantee", "limit"],
            "range": ["#2f6fde", "#f79009", "#12b76a", "#f04438"],
        },
    }
    layers: list[Spec] = [
        {
            "transform": [{"filter": "datum.kind === 'series'"}],
            "mark": {"type": "line", "interpolate": "step-after", "strokeWidth": 1.6},
            "encoding": {
                "x": {"field": "hours", "type": "quantitative", "title": "hours"},
                "y": {"field": "gpus", "type": "quantitative", "title": "GPUs"},
                "color": color,
                "strokeDash": {
                    "field": "series",
                    "type": "nominal",
                    "legend": None,
                    "scale": {"domain": ["held", "fair share"], "range": [[1, 0], [5, 3]]},
                },
                "tooltip": [
                    {"field": "queue"},
                    {"field": "series"},
                    {"field": "hours", "format": ".2f"},
                    {"field": "gpus", "format": ".2f"},
                ],
            },
        },
    ]
    if rules:
        layers.append(
            {
                "transform": [{"filter": "datum.kind === 'rule'"}],
                "mark": {"type": "rule", "strokeDash": [2, 3], "strokeWidth": 1.4},
                "encoding": {
                    "y": {"field": "gpus", "type": "quantitative"},
                    "color": color,
                    "tooltip": [{"field": "queue"}, {"field": "series"}, {"field": "gpus"}],
                },
            }
        )
    return {
        "data": {"values": rows + rules},
        "facet": {
            "row": {"field": "queue", "title": None, "sort": [names[q] for q in tree.leaves]},
            "column": {"field": "profile", "title": None, "sort": [res.profile for res in results]},
        },
        "spec": {"width": WIDTH, "height": HEIGHT, "layer": layers},
        "title": "GPUs held per queue (blue) against its fair share (orange dashed), guarantee and limit",
    }


def utilization_chart(scenario: Scenario, results: Sequence[SimResult]) -> Spec:
    total = max(1, sum(len(n.gpus) for n in scenario.nodes))
    rows = []
    for res in results:
        if not res.timeline.t:
            continue
        grid, alloc = _resample(res.timeline.t, np.asarray(res.timeline.allocated_gpus, dtype=float), res.horizon_s)
        rows += [
            {
                "profile": f"{res.profile} (mean {res.utilization:.1%})",
                "hours": round(h / 3600, 4),
                "pct": round(100 * a / total, 2),
            }
            for h, a in zip(grid.tolist(), alloc.tolist(), strict=True)
        ]
    return {
        "data": {"values": rows},
        "width": 2 * WIDTH,
        "height": HEIGHT,
        "mark": {"type": "line", "interpolate": "step-after"},
        "encoding": {
            "x": {"field": "hours", "type": "quantitative", "title": "hours"},
            "y": {
                "field": "pct",
                "type": "quantitative",
                "title": "% of GPUs allocated",
                "scale": {"domain": [0, 100]},
            },
            "color": {"field": "profile", "type": "nominal", "title": None},
            "tooltip": [{"field": "profile"}, {"field": "hours", "format": ".2f"}, {"field": "pct"}],
        },
        "title": "GPU utilization",
    }


def waits_by_queue(scenario: Scenario, result: SimResult, leaves: Sequence[str]) -> dict[str, np.ndarray]:
    """Submission → start of every workload submitted by the horizon, per leaf queue (a workload still
    waiting at the horizon counts the wait it has had so far, as in the run's wait percentiles)."""
    out: dict[str, list[float]] = {q: [] for q in leaves}
    for wl in scenario.workloads:
        if wl.submit_time <= result.horizon_s and wl.queue in out:
            out[wl.queue].append(result.starts.get(wl.name, result.horizon_s) - wl.submit_time)
    return {q: np.sort(np.asarray(w)) for q, w in out.items()}


def wait_chart(scenario: Scenario, results: Sequence[SimResult]) -> Spec:
    """The fraction of a queue's workloads that started within x hours: a column per profile on shared
    axes. Work that never started is not a wait that ended: its line stops below 1 and a cross marks how
    many never started and how long the longest of them had waited by the end."""
    leaves = scenario.tree().leaf_names()
    lines, never = [], []
    for res in results:
        by_queue: dict[str, list[dict[str, Any]]] = {q: [] for q in leaves}
        for row in res.workloads:
            if row["queue"] in by_queue:
                by_queue[row["queue"]].append(row)
        for q, rows in by_queue.items():
            if not rows:
                continue
            started = np.sort([w["wait_s"] for w in rows if w["first_start_s"] is not None])
            if len(started):
                idx = np.unique(np.linspace(0, len(started) - 1, min(len(started), POINTS)).astype(int))
                lines += [
                    {
                        "kind": "line",
                        "profile": res.profile,
                        "queue": q,
                        "hours": round(float(started[i]) / 3600, 4),
                        "fraction": round((i + 1) / len(rows), 4),
                    }
                    for i in idx
                ]
            waiting = [w["wait_s"] for w in rows if w["first_start_s"] is None]
            if waiting:
                never.append(
                    {
                        "kind": "never",
                        "profile": res.profile,
                        "queue": q,
                        "hours": round(max(waiting) / 3600, 4),
                        "fraction": round(len(started) / len(rows), 4),
                        "never_started": len(waiting),
                    }
                )
    x = {"field": "hours", "type": "quantitative", "title": "wait (hours)"}
    y = {"field": "fraction", "type": "quantitative", "title": "fraction started", "scale": {"domain": [0, 1]}}
    color = {"field": "queue", "type": "nominal", "sort": list(leaves)}
    layers: list[Spec] = [
        {
            "transform": [{"filter": "datum.kind === 'line'"}],
            "mark": {"type": "line", "interpolate": "step-after"},
            "encoding": {
                "x": x,
                "y": y,
                "color": color,
                "tooltip": [{"field": "queue"}, {"field": "hours", "format": ".2f"}, {"field": "fraction"}],
            },
        }
    ]
    if never:
        layers.append(
            {
                "transform": [{"filter": "datum.kind === 'never'"}],
                "mark": {"type": "point", "shape": "cross", "size": 120, "filled": True},
                "encoding": {
                    "x": x,
                    "y": y,
                    "color": color,
                    "tooltip": [
                        {"field": "queue"},
                        {"field": "never_started", "title": "never started"},
                        {"field": "hours", "title": "longest wait so far (h)", "format": ".2f"},
                    ],
                },
            }
        )
    return {
        "data": {"values": lines + never},
        "facet": {"column": {"field": "profile", "title": None, "sort": [res.profile for res in results]}},
        "spec": {"width": WIDTH, "height": HEIGHT, "layer": layers},
        "title": "Wait until start (a cross: workloads that never started, at the longest wait they had)",
    }


def eviction_chart(scenario: Scenario, results: Sequence[SimResult]) -> Spec | None:
    """When each queue lost work to preemption: a tick per eviction, a column per profile (None: none)."""
    leaves = scenario.tree().leaf_names()
    rows = [
        {"profile": res.profile, "queue": q, "hours": round(t / 3600, 4), "workload": w}
        for res in results
        for t, w, q in res.eviction_log
    ]
    if not rows:
        return None
    horizon = max((res.horizon_s for res in results), default=1.0) / 3600
    return {
        "data": {"values": rows},
        "facet": {"column": {"field": "profile", "title": None, "sort": [res.profile for res in results]}},
        "spec": {
            "width": WIDTH,
            "height": {"step": 22},
            "mark": {"type": "tick", "thickness": 2},
            "encoding": {
                "x": {"field": "hours", "type": "quantitative", "title": "hours", "scale": {"domain": [0, horizon]}},
                "y": {"field": "queue", "type": "nominal", "sort": list(leaves), "title": None},
                "color": {"field": "queue", "type": "nominal", "sort": list(leaves), "legend": None},
                "tooltip": [{"field": "workload"}, {"field": "queue"}, {"field": "hours", "format": ".2f"}],
            },
        },
        "title": f"Evictions ({sum(len(res.eviction_log) for res in results)} in all)",
    }


def fill_chart(curves: Mapping[str, Mapping[float, float]]) -> Spec:
    """The FGD fill experiment: median unallocated GPU % against arrived load L %, one line per policy."""
    rows = [
        {"policy": p, "load": float(x), "unallocated": float(v)} for p, pts in curves.items() for x, v in pts.items()
    ]
    return {
        "data": {"values": rows},
        "width": 2 * WIDTH,
        "height": 2 * HEIGHT,
        "mark": {"type": "line", "point": True},
        "encoding": {
            "x": {"field": "load", "type": "quantitative", "title": "arrived GPU load L (% of capacity)"},
            "y": {"field": "unallocated", "type": "quantitative", "title": "unallocated GPU %"},
            "color": {"field": "policy", "type": "nominal", "sort": list(curves)},
            "tooltip": [{"field": "policy"}, {"field": "load"}, {"field": "unallocated", "format": ".2f"}],
        },
        "title": "Fill experiment: unallocated GPUs",
    }


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; color: #1d2330; margin: 24px; }
h1 { font-size: 20px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; } th, td { border: 1px solid #d0d5dd; padding: 4px 8px; text-align: right; }
th:first-child, td:first-child, td.name { text-align: left; }
.chart { margin: 8px 0 16px; }
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


def _hours(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds / 3600:.2f}"


def queue_table(results: Sequence[SimResult]) -> str:
    """Per queue and profile: what it held and was owed, its waits, and what happened to its work."""
    cols = (
        "queue",
        "profile",
        "GPU-h",
        "entitled GPU-h",
        "wait p50 (h)",
        "wait p95 (h)",
        "submitted",
        "started",
        "never started",
        "preempted",
        "lost GPU-h",
    )
    out = ['<table class="queues"><tr>' + "".join(f"<th>{c}</th>" for c in cols) + "</tr>"]
    for name in results[0].queues if results else ():
        for i, res in enumerate(results):
            q = res.queues[name]
            cells = [
                html.escape(name) if i == 0 else "",
                html.escape(res.profile),
                f"{q['gpu_hours']:.1f}",
                f"{q['entitled_gpu_hours']:.1f}",
                _hours(q["wait_p50_s"]),
                _hours(q["wait_p95_s"]),
                str(q["submitted"]),
                str(q["submitted"] - q["never_started"]),
                str(q["never_started"]),
                str(q["preempted"]),
                f"{q['lost_gpu_hours']:.1f}",
            ]
            out.append(
                f'<tr data-queue="{html.escape(name)}" data-profile="{html.escape(res.profile)}">'
                + "".join(f'<td class="{"name" if k < 2 else ""}">{c}</td>' for k, c in enumerate(cells))
                + "</tr>"
            )
    out.append("</table>")
    return "".join(out)


def _script_json(doc: object) -> str:
    return json.dumps(doc).replace("</", "<\\/")  # never closes the script element it sits in


def render(
    scenario: Scenario, results: Sequence[SimResult], fill: Mapping[str, Mapping[float, float]] | None = None
) -> str:
    """The report's HTML: tables, then one chart per topic with every profile on the same scales."""
    total_gpus = sum(len(n.gpus) for n in scenario.nodes)
    charts: dict[str, Spec] = {}
    if results:
        charts["gpus"] = gpus_chart(scenario, results)
        charts["utilization"] = utilization_chart(scenario, results)
        charts["waits"] = wait_chart(scenario, results)
        evictions = eviction_chart(scenario, results)
        if evictions is not None:
            charts["evictions"] = evictions
    if fill:
        charts["fill"] = fill_chart(fill)
    libraries = "".join(f"<script>{(VENDOR / lib).read_text(encoding='utf-8')}</script>" for lib in LIBRARIES)
    parts = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f"<title>fairgpu report — {html.escape(scenario.name)}</title>",
        f"<style>{STYLE}</style>{libraries}</head><body>",
        f"<h1>fairgpu simulation report — {html.escape(scenario.name)}</h1>",
        f"<p>{html.escape(scenario.description or '')}</p>" if scenario.description else "",
        f"<p>{len(scenario.nodes)} nodes, {total_gpus} GPUs.</p>",
        _table(results) if results else "",
        "<h2>Per queue</h2>" + queue_table(results) if results else "",
    ]
    titles = {
        "gpus": "Share vs entitlement per queue",
        "utilization": "Utilization",
        "waits": "Wait times per queue",
        "evictions": "Eviction timeline",
        "fill": "Fill experiment",
    }
    for key in charts:
        parts.append(f'<h2>{titles[key]}</h2><div class="chart" id="chart-{key}" data-chart="{key}"></div>')
        if key == "waits" and "evictions" not in charts:
            parts.append('<h2>Eviction timeline</h2><p data-testid="no-evictions">No workload was evicted.</p>')
    parts.append(
        f"<script>const CHARTS = {_script_json(charts)};\n"
        "for (const [key, spec] of Object.entries(CHARTS)) {\n"
        "  vegaEmbed(`#chart-${key}`, spec, {actions: false, renderer: 'svg'})\n"
        "    .then(() => document.getElementById(`chart-${key}`).dataset.rendered = 'true');\n"
        "}</script>"
    )
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def write(path: Path, scenario: Scenario, results: Sequence[SimResult]) -> None:
    path.write_text(render(scenario, results), encoding="utf-8")
