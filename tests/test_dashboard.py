"""The dashboard in headless Chromium against a replayed demo cluster: each view loads, shows the engine's
numbers, logs no console error and fetches nothing off this machine. Screenshots go to out/screenshots/."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from tests.browser import SCREENSHOTS, Watch, chromium
from tests.conftest import fraction, gpu_node, whole

from fairgpu.catalog import load_profile
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import QueueSpec, QueueTree, Workload
from fairgpu.model.node import GPU_CORES
from fairgpu.observe.metrics import SchedulingMetrics
from fairgpu.observe.server import Background, create_app
from fairgpu.observe.source import LiveSource
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim.serve import replay_app

T = 3600.0  # an hour into the demo: every team has work running and waiting


@pytest.fixture(scope="module")
def server():
    app, source = replay_app(scenario_mod.load("demo"), load_profile("fairgpu"))
    with Background(app) as bg:
        yield bg, source


@pytest.fixture(scope="module")
def browser():
    with chromium() as context:
        yield context


@pytest.fixture
def page(browser):
    page = browser.new_page()
    watch = Watch()
    watch.attach(page)
    yield page
    page.close()
    assert watch.errors == [], watch.errors
    assert watch.external == [], watch.external


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def open_view(page, server, hash_: str, ready: str) -> None:
    bg, _ = server
    page.goto(f"{bg.url}/?t={T:g}#{hash_}")
    page.wait_for_selector(ready, timeout=20_000)


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_cluster_view_shows_the_engines_totals(page, server):
    open_view(page, server, "/cluster", "[data-testid=heatmap-cores_pct]")
    _, source = server
    with source.lock:
        st = source.sched.state
        assert source.now == T
        allocated = float((st.gpu_cores_cap - st.gpu_cores_free).sum()) / GPU_CORES
        running, pending = len(source.sched.running), len(source.sched.pending)
    assert page.text_content("[data-testid=total-gpus]") == str(st.total_gpus)
    assert page.text_content("[data-testid=allocated-gpus]") == f"{allocated:.2f}"
    assert page.text_content("[data-testid=running-workloads]") == str(running)
    assert page.text_content("[data-testid=pending-workloads]") == str(pending)
    assert page.locator("[data-testid=models] tr[data-model]").count() == len(st.models)
    assert page.text_content("[data-testid=time-label]").startswith("t=3600s")
    shot(page, "cluster")


def test_node_view_shows_each_gpu_with_its_pods(page, server):
    open_view(page, server, "/node/a100-0", "[data-testid=gpu]")
    _, source = server
    with source.lock:
        st = source.sched.state
        n = st.node_index["a100-0"]
        cores = [int(st.gpu_cores_cap[n, j] - st.gpu_cores_free[n, j]) for j in range(len(st.nodes[n].gpus))]
        tasks = [int(st.gpu_tasks[n, j]) for j in range(len(st.nodes[n].gpus))]
    gpus = page.locator("[data-testid=gpu]")
    assert gpus.count() == 8
    assert [int(gpus.nth(j).get_attribute("data-cores")) for j in range(8)] == cores
    assert [int(gpus.nth(j).get_attribute("data-pods")) for j in range(8)] == tasks
    assert page.text_content("[data-testid=node-name]") == "Node a100-0"
    shot(page, "node")


def test_queue_view_plots_usage_and_fair_share(page, server):
    open_view(page, server, "/queues", "[data-testid=queue-plot][data-rendered=true]")
    _, source = server
    with source.lock:
        v, names = source.sched.view, source.sched.tree.names()
        expected = {n: (f"{v.usage[q, 0]:.2f}", f"{v.entitled[q, 0]:.2f}") for q, n in enumerate(names)}
    charts = page.locator("[data-testid=queue-chart]")
    assert charts.count() == len(names)
    for i in range(charts.count()):
        chart = charts.nth(i)
        name = chart.get_attribute("data-queue")
        usage = chart.locator("[data-testid=queue-usage]").text_content()
        fair = chart.locator("[data-testid=queue-fair-share]").text_content()
        assert (usage, fair) == expected[name]
        # Vega-Lite draws one line per series (usage, fair share), and an axis with ticks on each side
        assert chart.locator(".mark-line path").count() == 2
        assert chart.locator(".role-axis-label text").count() >= 4
    assert page.locator("[data-testid=tree-queue]").count() == len(names)
    shot(page, "queues")


def test_workload_view_explains_why_pending(page, server):
    bg, source = server
    pending = get(f"{bg.url}/api/workloads?t={T:g}")["pending"]
    name = pending[0]["workload"]
    with source.lock:
        exp = source.sched.explain(name, T)
    open_view(page, server, f"/workload/{name}", "[data-testid=reasons]")
    assert page.text_content("[data-testid=workload-state]") == "pending"
    reasons = page.locator("[data-testid=reasons] li").all_text_contents()
    assert reasons == exp.reasons
    assert page.text_content("[data-testid=position-in-queue]") == f"{exp.position_in_queue} of {exp.queue_pending}"
    assert page.text_content("[data-testid=estimated-start]").startswith(f"t={exp.estimated_start:.0f}s")
    shot(page, "workload")


def test_time_slider_moves_the_replay(page, server):
    open_view(page, server, "/cluster", "[data-testid=heatmap-cores_pct]")
    page.fill("#time", "600")
    page.dispatch_event("#time", "change")
    page.wait_for_function("document.getElementById('view').dataset.loadedAt === '600'", timeout=20_000)
    _, source = server
    with source.lock:
        assert source.now == 600
        running = len(source.sched.running)
    assert page.text_content("[data-testid=running-workloads]") == str(running)


def test_cluster_view_of_a_thousand_nodes_renders_quickly(browser):
    """1,000 nodes × 8 GPUs, half of them shared by fractional pods: the page shows it all in a few seconds."""
    nodes = [gpu_node(f"node-{i:04d}") for i in range(1000)]
    tree = QueueTree([QueueSpec("a"), QueueSpec("b")])
    sched = Scheduler(nodes, tree, load_profile("fairgpu"))
    for i in range(4000):
        sched.submit(Workload(f"w-{i}", "a", (whole(),), 0.0, duration=60.0))
        sched.submit(Workload(f"f-{i}", "b", (fraction(25, 10240),), 0.0, duration=60.0))
    sched.cycle(0.0)
    allocated = sched.state.allocated_gpu_equivalents()
    registry = CollectorRegistry()
    SchedulingMetrics(registry)
    with Background(create_app(LiveSource.of(sched, "thousand", clock=lambda: 0.0), registry)) as bg:
        page = browser.new_page()
        watch = Watch()
        watch.attach(page)
        began = time.perf_counter()
        page.goto(f"{bg.url}/#/cluster")
        page.wait_for_selector("[data-testid=heatmap-memory_pct]", timeout=30_000)
        seconds = time.perf_counter() - began
        assert page.text_content("[data-testid=total-nodes]") == "1000"
        assert page.text_content("[data-testid=allocated-gpus]") == f"{allocated:.2f}"
        assert page.locator("#clock").is_hidden()  # a live cluster has no time slider
        shot(page, "cluster-1000-nodes")
        page.close()
    assert watch.errors == [] and watch.external == []
    assert seconds < 5.0, seconds


def test_play_advances_the_replay(page, server):
    open_view(page, server, "/queues", "[data-testid=queue-plot][data-rendered=true]")
    page.click("#play")
    # one step is 1/200 of the 6 h horizon: 108 s
    page.wait_for_function("Number(document.getElementById('view').dataset.loadedAt) > 3600", timeout=20_000)
    page.click("#play")
    assert float(page.get_attribute("#view", "data-loaded-at")) >= 3600 + 108


def test_heat_map_fits_the_window_with_node_names_and_tooltips(page, server):
    open_view(page, server, "/cluster", "[data-testid=heatmap-cores_pct]")
    canvas = page.locator("[data-testid=heatmap-cores_pct]")
    box = canvas.bounding_box()
    assert box["x"] + box["width"] <= 1400 / 2 + 16  # its half of the 1,400 px window
    assert canvas.get_attribute("data-nodes-per-row") == "1"  # eight nodes: a labelled row each
    cell = int(canvas.get_attribute("data-cell"))
    # GPU 3 of the third node (a100-2): hover names it and says what is allocated there
    _, source = server
    label = float(box["width"]) - 8 * cell  # the node names sit left of the cells
    page.mouse.move(box["x"] + label + 3 * cell + cell / 2, box["y"] + 2 * (cell + 2) + cell / 2)
    tip = page.locator("[data-testid=heatmap-tip-cores_pct]")
    tip.wait_for(state="visible")
    with source.lock:
        view = __import__("fairgpu.observe.views", fromlist=["cluster_view"]).cluster_view(source.sched)
    i = view["heatmap"]["nodes"].index("a100-2")
    assert tip.text_content() == f"a100-2 · GPU 3: {view['heatmap']['cores_pct'][i][3]}% cores allocated"
    canvas.click(position={"x": label + 3 * cell + cell / 2, "y": 2 * (cell + 2) + cell / 2})
    page.wait_for_selector("[data-testid=node-name]")
    assert page.text_content("[data-testid=node-name]") == "Node a100-2"


def test_workloads_are_paged_searchable_and_filtered_by_queue(page, server):
    bg, _ = server
    open_view(page, server, "/workloads", "[data-testid=workload-item]")
    everything = get(f"{bg.url}/api/workloads?t={T:g}")
    assert page.locator("[data-testid=workload-item]").count() == 2 * 50  # a page of each list
    assert page.text_content("[data-testid=page-label]").strip() == f"1–50 of {everything['pending_total']}"
    page.click("[data-testid=page-next]")
    page.wait_for_function("document.querySelector('[data-testid=page-label]').textContent.includes('51–100')")
    first = page.locator("[data-testid=workload-item]").first.text_content()
    assert first.startswith(everything["pending"][50]["workload"] + " ")
    page.select_option("[data-testid=workload-queue]", "training")
    page.wait_for_function("document.querySelector('[data-testid=workload-totals]').textContent.includes('pending 6 ')")
    training = get(f"{bg.url}/api/workloads?t={T:g}&queue=training")
    assert page.text_content("[data-testid=workload-totals]") == (
        f"pending {training['pending_total']} · running {training['running_total']}"
    )
    items = page.locator("[data-testid=workload-item]").all_text_contents()
    assert items and all("[training]" in x for x in items)
    wanted = items[-1].split(" ")[0]
    page.fill("[data-testid=workload-search]", wanted.upper())  # any case
    page.dispatch_event("[data-testid=workload-search]", "change")
    page.wait_for_function(f"document.querySelectorAll('[data-testid=workload-item]').length < {len(items)}")
    names = [x.split(" ")[0] for x in page.locator("[data-testid=workload-item]").all_text_contents()]
    assert wanted in names and all(wanted in n for n in names)
    shot(page, "workloads")


def test_loading_sign_while_the_replay_catches_up(page, server):
    def slow(route):
        time.sleep(1.0)
        route.continue_()

    page.route("**/api/cluster*", slow)
    bg, _ = server
    page.goto(f"{bg.url}/?t=1800#/cluster")
    page.wait_for_selector("[data-testid=loading]", state="visible", timeout=5_000)
    page.wait_for_selector("[data-testid=heatmap-cores_pct]", timeout=20_000)
    assert page.locator("[data-testid=loading]").is_hidden()
