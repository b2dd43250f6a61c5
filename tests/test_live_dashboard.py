"""The dashboard and its JSON API as `fairgpu run` serves them (the app `simulate --serve` serves), over HTTP,
read from a live controller's engine while it schedules against the fake apiserver."""

from __future__ import annotations

import asyncio

import aiohttp

from fairgpu.catalog import load_profile
from fairgpu.k8s.app import dashboard_app
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from fairgpu.observe.server import Beside
from fake_kubelet import FakeNodes
from test_live_scheduling import node, pod, until

WHOLE = {"nvidia.com/gpu": "1"}
HALF = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "20000"}


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, dict | str]:
    async with http.get(url) as resp:
        body = await resp.json() if resp.content_type == "application/json" else await resp.text()
        return resp.status, body


def test_live_dashboard_shows_what_the_controller_bound(fake_api, tmp_path):
    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        for team in ("a", "b"):
            await port.create(QUEUES, {"metadata": {"name": f"team-{team}"}, "spec": {"namespaces": [team]}})
        for i in range(2):
            await port.create(PODS, pod("a", f"whole-{i}", WHOLE), "a")
            await port.create(PODS, pod("b", f"half-{i}", HALF), "b")
        nodes = FakeNodes(port)
        kubelet = asyncio.create_task(nodes.run())
        ctl = Controller(port, load_profile("fairgpu"))
        async with Beside(dashboard_app(ctl, "fake-cluster")) as dash, aiohttp.ClientSession() as http:
            url = dash.url
            # before its caches sync the controller has no engine: probes say so, the API answers 503
            assert await get(http, f"{url}/healthz") == (200, "ok")
            assert (await get(http, f"{url}/readyz"))[0] == 503
            status, body = await get(http, f"{url}/api/cluster")
            assert status == 503 and "error" in body
            run = asyncio.create_task(ctl.run())
            running = lambda: sum(1 for o in nodes.informer.cache.values() if o["status"].get("phase") == "Running")  # noqa: E731
            await until(lambda: running() == 4, 20, "the four pods to run")

            assert await get(http, f"{url}/readyz") == (200, "ok")
            status, page = await get(http, f"{url}/")
            assert status == 200 and "<html" in page.lower()
            _, info = await get(http, f"{url}/api/info")
            assert (info["name"], info["profile"], info["horizon"]) == ("fake-cluster", "fairgpu", None)
            assert info["queues"] == ["team-a", "team-b"]
            _, workloads = await get(http, f"{url}/api/workloads")
            running_wl = {(w["workload"], w["queue"], w["placed"]) for w in workloads["running"]}
            assert running_wl == {
                ("a/whole-0", "team-a", 1),
                ("a/whole-1", "team-a", 1),
                ("b/half-0", "team-b", 1),
                ("b/half-1", "team-b", 1),
            }
            _, view = await get(http, f"{url}/api/nodes/node-00")
            listed = {(p["pod"], p["queue"], p["cores"]) for g in view["gpus"] for p in g["pods"]}
            assert listed == {
                ("a/whole-0", "team-a", 100),
                ("a/whole-1", "team-a", 100),
                ("b/half-0", "team-b", 50),
                ("b/half-1", "team-b", 50),
            }
            for g in view["gpus"]:  # each GPU's bar is the sum of the pods listed on it
                assert g["cores_allocated"] == sum(p["cores"] for p in g["pods"])
            _, cluster = await get(http, f"{url}/api/cluster")
            assert cluster["totals"]["running_workloads"] == 4 and cluster["totals"]["allocated_gpus"] == 3.0
            _, queues = await get(http, f"{url}/api/queues")
            usage = {q["name"]: q["usage"]["gpu"] for q in queues["queues"]}
            assert usage == {"team-a": 2.0, "team-b": 1.0}
            assert queues["times"] and queues["queues"][0]["history"]["gpu"]["usage"][-1] == 2.0
            _, explained = await get(http, f"{url}/api/workloads/a%2Fwhole-0")
            assert explained["state"] == "running" and explained["queue"] == "team-a"
            status, exposition = await get(http, f"{url}/metrics")
            assert status == 200 and 'fairgpu_queue_usage{queue="team-a",resource="gpu"} 2.0' in exposition
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)

        # A successor takes what it finds running as running workloads of their queues: the GPUs stay
        # accounted and the pods listed under their workloads.
        ctl = Controller(port, load_profile("fairgpu"))
        async with Beside(dashboard_app(ctl, "fake-cluster")) as dash, aiohttp.ClientSession() as http:
            run = asyncio.create_task(ctl.run())
            await until(lambda: ctl.engine is not None and len(ctl.owned) == 4, 20, "the successor to adopt the pods")
            _, view = await get(http, f"{dash.url}/api/nodes/node-00")
            listed = {(p["pod"], p["workload"], p["queue"]) for g in view["gpus"] for p in g["pods"]}
            assert listed == {
                ("a/whole-0", "a/whole-0", "team-a"),
                ("a/whole-1", "a/whole-1", "team-a"),
                ("b/half-0", "b/half-0", "team-b"),
                ("b/half-1", "b/half-1", "team-b"),
            }
            _, queues = await get(http, f"{dash.url}/api/queues")
            assert {q["name"]: q["usage"]["gpu"] for q in queues["queues"]} == {"team-a": 2.0, "team-b": 1.0}
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        kubelet.cancel()
        await asyncio.gather(kubelet, return_exceptions=True)
        assert not nodes.violations, nodes.violations[:3]  # HAMi's device plugin took every bound pod
        await port.close()

    asyncio.run(asyncio.wait_for(go(), 60))
