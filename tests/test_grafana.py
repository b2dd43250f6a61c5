"""deploy/grafana/fairgpu-dashboard.json queries only metrics fairgpu exports, and shows each of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from fairgpu.catalog import load_profile
from fairgpu.observe.metrics import EngineCollector, SchedulingMetrics
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim.replay import Replay

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "fairgpu-dashboard.json"
METRIC = re.compile(r"\bfairgpu_[a-zA-Z0-9_:]+")


def exported() -> tuple[set[str], set[str]]:
    """(sample names a query may use, family names) of a registry holding every fairgpu metric."""
    registry = CollectorRegistry()
    source = Replay(scenario_mod.load("demo"), load_profile("fairgpu"), SchedulingMetrics(registry), horizon=600)
    registry.register(EngineCollector(source))
    source.seek(600)
    families = list(registry.collect())
    # by type, not by the samples present: a family may have none yet (no preemption, no limit set)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    samples = {f.name + sfx for f in families for sfx in suffixes[f.type]}
    return samples, {f.name for f in families}


def queries(doc: dict) -> list[str]:
    out = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    out += [v["query"]["query"] for v in doc["templating"]["list"] if isinstance(v.get("query"), dict)]
    return out


def test_every_query_names_existing_metrics():
    doc = json.loads(DASHBOARD.read_text())
    samples, _ = exported()
    for expr in queries(doc):
        names = METRIC.findall(expr)
        assert names, expr
        for name in names:
            assert name in samples, f"{name} in {expr!r} is not exported"


def test_every_metric_is_on_the_dashboard():
    text = " ".join(queries(json.loads(DASHBOARD.read_text())))
    _, families = exported()
    for family in families:
        assert re.search(rf"\b{family}(_total|_bucket)?\b", text), family


def test_variables_and_datasource():
    doc = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert set(variables) == {"datasource", "node", "queue"}
    assert variables["datasource"]["type"] == "datasource"
    for panel in doc["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
    assert any("$node" in q for q in queries(doc)) and any("$queue" in q for q in queries(doc))
