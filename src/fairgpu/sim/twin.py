"""Replaying a recorded trace: what the cluster did (from the trace), beside what the engine does with the
same arrivals under the recorded queues and profile, and under changed ones (`--queues`, `--profile`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError
from rich.table import Table

from fairgpu.errors import ScenarioError
from fairgpu.framework.profile import Profile
from fairgpu.model import QueueSpec, QueueTree
from fairgpu.sim.recorded import FairgpuTrace
from fairgpu.sim.runner import SimResult
from fairgpu.sim.scenario import Scenario, read_text
from fairgpu.spec import QueueDoc, load_yaml_all, validation_message

HOUR = 3600.0
RECORDED = "recorded"


@dataclass(slots=True)
class Column:
    """One run, side by side with the others: per queue GPU-hours, starts, evictions, waits."""

    label: str
    queues: dict[str, dict[str, Any]]
    evictions: int
    utilization: float


def recorded(trace: FairgpuTrace, horizon: float) -> Column:
    """What the cluster did up to `horizon`, as its trace tells it, measured as the simulator measures a run."""
    sc = trace.scenario
    gpu_s = {q.name: 0.0 for q in sc.queues}
    evicted = {q.name: 0 for q in sc.queues}
    last: dict[str, float] = {}  # its last start: a requeued workload waits until it runs again (as SimResult)
    for run in trace.runs:
        end = horizon if run.end is None else min(run.end, horizon)
        if run.ran is not None and run.end is not None and run.end <= horizon:
            end = run.start + run.ran
        gpu_s[run.queue] += run.gpus * max(0.0, end - run.start)
        evicted[run.queue] += run.evicted
        last[run.workload] = max(last.get(run.workload, run.start), run.start)
    waits: dict[str, list[float]] = {q.name: [] for q in sc.queues}
    for wl in sc.workloads:
        if wl.submit_time > horizon:
            continue
        waits[wl.queue].append(last.get(wl.name, horizon) - wl.submit_time)
    started = {q.name: sum(1 for wl in sc.workloads if wl.queue == q.name and wl.name in last) for q in sc.queues}
    queues = {
        name: {
            "gpu_hours": gpu_s[name] / HOUR,
            "submitted": len(waits[name]),
            "started": started[name],
            "preempted": evicted[name],
            "wait_p95_s": float(np.percentile(waits[name], 95)) if waits[name] else None,
        }
        for name in gpu_s
    }
    # The inventory's GPUs over time, each snapshot holding until the next.
    inventories = [(0.0, sc.nodes), *((c.t, c.nodes) for c in sc.changes if c.nodes is not None)]
    ends = [t for t, _ in inventories[1:]] + [horizon]
    capacity = sum(
        sum(len(n.gpus) for n in nodes) * max(0.0, min(end, horizon) - t)
        for (t, nodes), end in zip(inventories, ends, strict=True)
    )
    used = sum(gpu_s.values())
    return Column(RECORDED, queues, sum(evicted.values()), used / capacity if capacity else 0.0)


def replayed(label: str, res: SimResult) -> Column:
    queues = {
        name: {
            "gpu_hours": q["gpu_hours"],
            "submitted": q["submitted"],
            "started": q["submitted"] - q["never_started"],
            "preempted": q["preempted"],
            "wait_p95_s": q["wait_p95_s"],
        }
        for name, q in res.queues.items()
    }
    return Column(label, queues, res.evictions, res.utilization)


def load_queues(path: Path) -> list[QueueSpec]:
    """`--queues FILE`: a scenario's `queues:` list, a bare list of queues, or Queue resources as `kubectl get
    queues.fairgpu.io -o yaml` prints them (metadata.name and spec; spec.namespaces is the cluster's business).
    Raises ScenarioError naming the file and the field."""
    docs = [d for d in load_yaml_all(read_text(path), str(path)) if d is not None]
    items: list[Any] = []
    for doc in docs:
        if isinstance(doc, dict) and isinstance(doc.get("queues"), list):
            items += doc["queues"]
        elif isinstance(doc, dict) and isinstance(doc.get("items"), list):
            items += doc["items"]
        elif isinstance(doc, list):
            items += doc
        else:
            items.append(doc)
    if not items:
        raise ScenarioError(f"--queues: {path} holds no queues")
    specs = []
    for i, item in enumerate(items):
        where = f"--queues: {path}: queues[{i}]"
        if not isinstance(item, dict):
            raise ScenarioError(f"{where}: expected a mapping")
        if "metadata" in item:  # a Queue resource
            spec = {k: v for k, v in (item.get("spec") or {}).items() if k != "namespaces"}
            item = {"name": (item.get("metadata") or {}).get("name", ""), **spec}
        try:
            specs.append(QueueDoc.model_validate(item).to_spec())
        except ValidationError as err:
            raise ScenarioError(f"{where}.{validation_message(err)}") from None
    try:
        QueueTree(specs)
    except ValueError as err:
        raise ScenarioError(f"--queues: {path}: {err}") from None
    return specs


def with_queues(sc: Scenario, queues: list[QueueSpec], origin: str) -> Scenario:
    """The same arrivals under other queues: every queue the trace's workloads use must be a leaf of them."""
    tree = QueueTree(queues)
    for wl in sc.workloads:
        qi = tree.index.get(wl.queue)
        if qi is None or not tree.is_leaf[qi]:
            why = "is missing" if qi is None else "has child queues"
            used = sum(1 for w in sc.workloads if w.queue == wl.queue)
            raise ScenarioError(f"--queues: {origin}: queue {wl.queue!r} ({used} workloads in the trace) {why}")
    # These queues hold for the whole replay: the trace's own queue changes are replaced by them too.
    changes = [replace(c, queues=None) for c in sc.changes if c.nodes is not None]
    return replace(sc, queues=queues, changes=changes, description=f"{sc.description}, queues from {origin}")


def table(columns: list[Column], horizon: float) -> Table:
    """Per queue, every run side by side: the recorded run first, then the replays."""
    t = Table(title=f"Side by side over {horizon / HOUR:.3g} h", title_justify="left")
    t.add_column("queue")
    t.add_column("")
    for c in columns:
        t.add_column(c.label, justify="right")
    names = list(columns[0].queues)
    rows: list[tuple[str, str]] = [("GPU-h", "gpu_hours"), ("started", "started"), ("preempted", "preempted")]
    rows.append(("wait p95", "wait_p95_s"))
    for name in names:
        for i, (label, key) in enumerate(rows):
            got = [c.queues.get(name, {}) for c in columns]
            cells = [_cell(q.get(key), key, q.get("submitted", 0)) for q in got]
            t.add_row(name if i == 0 else "", label, *cells, end_section=i == len(rows) - 1)
    t.add_row("all", "GPU util", *[f"{c.utilization:.1%}" for c in columns])
    t.add_row("", "evictions", *[str(c.evictions) for c in columns])
    return t


def _cell(value: float | None, key: str, submitted: int) -> str:
    if value is None:
        return "—"
    if key == "gpu_hours":
        return f"{value:.2f}"
    if key == "started":
        return f"{value:.0f}/{submitted}"
    if key == "wait_p95_s":
        return f"{value / 60:.1f}m" if value < HOUR else f"{value / HOUR:.1f}h"
    return f"{value:.0f}"


@dataclass(slots=True)
class Plan:
    """One replay to run: its label in the table, the scenario and the profile."""

    label: str
    scenario: Scenario
    profile: Profile


def plan(trace: FairgpuTrace, recorded_profile: Profile, profiles: list[Profile], queues: Path | None) -> list[Plan]:
    """The replay under the recorded queues and profile, then one what-if per profile asked for (the
    recorded one if none), under `queues` when given: what changed names the column."""
    sc = trace.scenario
    out = [Plan(f"replay ({recorded_profile.name})", sc, recorded_profile)]
    if queues is None and not profiles:
        return out
    changed = sc if queues is None else with_queues(sc, load_queues(queues), queues.name)
    for prof in profiles or [recorded_profile]:
        label = f"{prof.name}, {queues.name}" if queues is not None else prof.name
        out.append(Plan(f"what-if ({label})", changed, prof))
    return out
