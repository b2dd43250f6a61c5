"""`simulate --report`: one self-contained HTML file with every plot, opened offline in Chromium."""

from __future__ import annotations

import re

import pytest
from tests.browser import SCREENSHOTS, Watch, chromium
from typer.testing import CliRunner

from fairgpu.catalog import load_profile
from fairgpu.cli import app
from fairgpu.sim import report
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim.runner import simulate


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "out.html"
    result = CliRunner().invoke(app, ["simulate", "--scenario", "demo", "--horizon", "2h", "--report", str(path)])
    assert result.exit_code == 0, result.output
    return path


def test_report_is_self_contained(report_file):
    text = report_file.read_text()
    assert "<script" not in text and "<link" not in text and "@import" not in text
    # the only URL is the SVG namespace, which names the vocabulary and is never fetched
    assert set(re.findall(r"https?://[^\s\"'<>)]+", text)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"""(src|href)\s*=""", text)


def test_report_opens_offline_with_every_plot(report_file):
    with chromium() as context:
        context.set_offline(True)
        page = context.new_page()
        watch = Watch()
        watch.attach(page)
        page.goto(report_file.as_uri())
        # two profiles side by side: per run, a share chart per leaf queue, utilization, wait times
        runs = page.locator("h2:has-text('Utilization') + .cols .run")
        assert runs.count() == 2
        charts = page.locator("svg.chart")
        assert charts.count() == 2 * (4 + 1 + 1)
        for i in range(charts.count()):
            assert charts.nth(i).locator("polyline").count() >= 1
            box = charts.nth(i).bounding_box()
            assert box is not None and box["width"] > 200 and box["height"] > 100
        labels = page.locator("svg.chart").first.get_attribute("aria-label")
        assert labels == "research — kube-default"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "report.png"), full_page=True)
        page.close()
    assert watch.errors == [] and watch.external == []


def test_fill_chart_plots_one_line_per_policy():
    curves = {"FGD": {0: 0.0, 50: 0.5, 100: 4.77, 130: 20.0}, "BestFit": {0: 0.0, 50: 1.0, 100: 7.09, 130: 25.0}}
    svg = report.fill_chart(curves)
    lines = re.findall(r'<polyline points="([^"]*)"', svg)
    assert len(lines) == 2
    assert [len(pts.split()) for pts in lines] == [4, 4]  # straight segments between the L points
    assert ">FGD<" in svg and ">BestFit<" in svg
    # the highest value sits at the top of the plot area, 0 at the bottom
    ys = [float(p.split(",")[1]) for p in lines[1].split()]
    assert ys[0] == pytest.approx(report.H - report.BOTTOM) and min(ys) == ys[-1]


def test_render_with_a_fill_result_and_one_run():
    sc = scenario_mod.load("demo")
    res = simulate(sc, load_profile("fairgpu"), horizon=1800)
    html = report.render(sc, [res], fill={"FGD": {100: 4.77}})
    assert html.count("<svg") == 4 + 1 + 1 + 1
    assert "Fill experiment" in html


def test_waits_count_workloads_still_waiting_at_the_horizon():
    sc = scenario_mod.load("demo")
    res = simulate(sc, load_profile("fairgpu"), horizon=1800)
    waits = report.waits_by_queue(sc, res, ["research", "batch"])
    submitted = sum(1 for w in sc.workloads if w.queue == "research" and w.submit_time <= 1800)
    assert len(waits["research"]) == submitted
    assert waits["research"].max() == pytest.approx(res.queues["research"]["wait_max_s"])


def test_fill_chart_shows_in_the_browser(tmp_path):
    """Synthetic medians standing in for `fairgpu fill`: the chart draws one visible line per policy."""
    sc = scenario_mod.load("demo")
    curves = {
        policy: {L: max(0.0, (L - 80) * slope) + base for L in range(0, 135, 5)}
        for policy, slope, base in (("FGD", 0.3, 0.0), ("BestFit", 0.45, 0.5), ("Random", 0.7, 1.0))
    }
    path = tmp_path / "fill.html"
    path.write_text(report.render(sc, [], fill=curves))
    with chromium() as context:
        context.set_offline(True)
        page = context.new_page()
        watch = Watch()
        watch.attach(page)
        page.goto(path.as_uri())
        lines = page.locator("svg.chart polyline")
        assert lines.count() == 3
        for i in range(3):
            box = lines.nth(i).bounding_box()
            assert box is not None and box["width"] > 200
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "report-fill.png"), full_page=True)
        page.close()
    assert watch.errors == [] and watch.external == []
