"""`simulate --report`: one self-contained HTML file, Vega-Lite charts with every profile on the same
scales, guarantee and limit lines, never-started work marked, an eviction timeline and a per-queue table;
opened offline in Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tests.browser import SCREENSHOTS, Watch, chromium
from typer.testing import CliRunner

from fairgpu.catalog import load_profile
from fairgpu.cli import app
from fairgpu.sim import report
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim.runner import simulate

# One 8-GPU node. a (guarantee 2, limit 6) floods it at t=0; b (guarantee 4, reclaims at once) arrives at
# 30m; c asks for a whole node at 1h, which no one frees in time: it never starts.
SCENARIO = """\
name: report-check
horizon: 3h
cluster:
  nodes:
    - {count: 1, name: n, gpus: 8, gpu_model: A100-80GB, gpu_memory: 80Gi, cpu: 64, memory: 512Gi}
queues:
  - {name: a, guaranteed: {nvidia.com/gpu: 2}, limit: {nvidia.com/gpu: 6}}
  - {name: b, guaranteed: {nvidia.com/gpu: 4}, preemption: {reclaim: true}}
  - {name: c}
workloads:
  - {queue: a, name: a, count: 8, duration: 2h, requests: {nvidia.com/gpu: 1, cpu: "1", memory: 1Gi}}
  - {queue: b, name: b, at: 30m, count: 4, duration: 1h, requests: {nvidia.com/gpu: 1, cpu: "1", memory: 1Gi}}
  - {queue: c, name: c, at: 1h, duration: 1h, requests: {nvidia.com/gpu: 8, cpu: "1", memory: 1Gi}}
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    (folder / "s.yaml").write_text(SCENARIO)
    path = folder / "out.html"
    args = ["simulate", "--scenario", str(folder / "s.yaml"), "--report", str(path), "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return path, {r["profile"]: r for r in json.loads(result.stdout)["runs"]}


def charts(path: Path) -> dict:
    text = path.read_text()
    return json.loads(re.search(r"const CHARTS = (\{.*?\});\n", text, re.S)[1].replace("<\\/", "</"))


def test_report_is_self_contained(run):
    path, _ = run
    text = path.read_text()
    assert "<link" not in text and "@import" not in text
    assert "vegaEmbed(" in text and text.count("<script>") == 4  # vega, vega-lite, vega-embed, the charts
    page = re.sub(r"<script>.*?</script>", "", text, flags=re.S)  # the markup around the inlined libraries
    assert "<script" not in page and not re.search(r"""(src|href)\s*=""", page)


def test_profiles_share_one_scale_per_chart(run):
    path, _ = run
    specs = charts(path)
    for key in ("gpus", "waits"):  # a facet over profiles: one y scale unless resolved apart
        assert specs[key]["facet"]["column"]["field"] == "profile"
        assert "resolve" not in specs[key]
        assert {row["profile"] for row in specs[key]["data"]["values"]} == {"kube-default", "fairgpu"}
    assert specs["utilization"]["encoding"]["color"]["field"] == "profile"  # both runs on one set of axes


def test_guarantee_and_limit_lines(run):
    path, _ = run
    rules = [d for d in charts(path)["gpus"]["data"]["values"] if d["kind"] == "rule"]
    got = {(d["queue"], d["series"], d["gpus"]) for d in rules if d["profile"] == "fairgpu"}
    assert got == {("a", "guarantee", 2.0), ("a", "limit", 6.0), ("b", "guarantee", 4.0)}


def test_never_started_work_is_marked(run):
    path, results = run
    never = [d for d in charts(path)["waits"]["data"]["values"] if d["kind"] == "never"]
    for profile, res in results.items():
        expected = {q: v["never_started"] for q, v in res["queues"].items() if v["never_started"]}
        assert {d["queue"]: d["never_started"] for d in never if d["profile"] == profile} == expected
    assert results["fairgpu"]["queues"]["c"]["never_started"] == 1


def test_eviction_timeline_has_every_eviction(run):
    path, results = run
    rows = charts(path)["evictions"]["data"]["values"]
    assert results["fairgpu"]["evictions"] > 0
    for profile, res in results.items():
        assert sum(r["profile"] == profile for r in rows) == res["evictions"]
    assert all(r["queue"] == "a" and 0.5 <= r["hours"] <= 3 for r in rows)


def test_per_queue_table(run):
    path, results = run
    text = path.read_text()
    for profile, res in results.items():
        for q, v in res["queues"].items():
            row = re.search(rf'<tr data-queue="{q}" data-profile="{profile}">(.*?)</tr>', text)[1]
            cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
            assert cells[6:10] == [str(v["submitted"]), str(v["submitted"] - v["never_started"]),
                                   str(v["never_started"]), str(v["preempted"])]  # fmt: skip


def test_report_opens_offline_with_every_chart(run):
    path, _ = run
    with chromium() as context:
        context.set_offline(True)
        page = context.new_page()
        watch = Watch()
        watch.attach(page)
        page.goto(path.as_uri())
        page.wait_for_function(
            "[...document.querySelectorAll('[data-chart]')].every(e => e.dataset.rendered === 'true')", timeout=60_000
        )
        for key in ("gpus", "utilization", "waits", "evictions"):
            box = page.locator(f"#chart-{key} svg").first.bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 100, key
        # one y axis per queue row, shared by both profile columns, all with the same range
        axes = page.eval_on_selector_all("#chart-gpus [aria-label^='Y-axis']", "els => els.map(e => e.ariaLabel)")
        assert len(axes) == 3 and len(set(axes)) == 1, axes
        assert page.locator("#chart-gpus .mark-rule path, #chart-gpus .mark-rule line").count() >= 3
        assert page.locator("#chart-waits .mark-symbol path").count() >= 1  # the never-started crosses
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "report.png"), full_page=True)
        page.close()
    assert watch.errors == [] and watch.external == []


def test_fill_chart_plots_one_line_per_policy():
    curves = {"FGD": {0: 0.0, 50: 0.5, 100: 4.77, 130: 20.0}, "BestFit": {0: 0.0, 50: 1.0, 100: 7.09, 130: 25.0}}
    spec = report.fill_chart(curves)
    rows = spec["data"]["values"]
    assert {r["policy"] for r in rows} == {"FGD", "BestFit"} and len(rows) == 8
    assert {(r["load"], r["unallocated"]) for r in rows if r["policy"] == "FGD"} == {
        (0.0, 0.0), (50.0, 0.5), (100.0, 4.77), (130.0, 20.0)}  # fmt: skip


def test_render_with_a_fill_result_and_no_run():
    html = report.render(scenario_mod.load("demo"), [], fill={"FGD": {0: 0.0, 100: 4.0}})
    assert 'data-chart="fill"' in html and html.count("data-chart=") == 1


def test_waits_count_workloads_still_waiting_at_the_horizon():
    sc = scenario_mod.load("demo")
    res = simulate(sc, load_profile("kube-default"), horizon=1800)
    waits = report.waits_by_queue(sc, res, ["research"])
    submitted = res.queues["research"]["submitted"]
    assert len(waits["research"]) == submitted
    assert waits["research"].max() == pytest.approx(res.queues["research"]["wait_max_s"])
