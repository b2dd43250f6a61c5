"""Live, a pod runs only where kube-scheduler would let it: its nodeSelector, required node affinity and
tolerations are read from the pod and the node's taints from the Node, so fairgpu never binds a pod onto a
node its owner excluded or a tainted node it does not tolerate; a rule fairgpu cannot honour leaves the pod
pending with a reason instead of being ignored."""

from __future__ import annotations

import asyncio

from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import NODES, PODS, QUEUES
from test_live_scheduling import node, pod, stop, until


def test_pods_bind_only_where_their_selector_affinity_and_tolerations_allow(fake_api, tmp_path) -> None:
    fake_api.control("device-plugin")

    def labelled(i: int, labels: dict, taints: list | None = None) -> dict:
        n = node(i)
        n["metadata"]["labels"] = labels
        if taints:
            n["spec"] = {"taints": taints}
        return n

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        # node-00 comes first and is emptiest-equal: without the rules every pod could go there
        await port.create(NODES, labelled(0, {"pool": "infer"}))
        await port.create(NODES, labelled(1, {"pool": "train"}))
        dedicated = [{"key": "dedicated", "value": "research", "effect": "NoSchedule"}]
        await port.create(NODES, labelled(2, {"pool": "train", "team": "research"}, dedicated))
        await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
        sel = pod("a", "sel", {"nvidia.com/gpu": "8"})
        sel["spec"]["nodeSelector"] = {"pool": "train"}  # node-01 (node-02 is tainted)
        aff = pod("a", "aff", {"nvidia.com/gpu": "8"})
        aff["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["train"]}]}]
        }}}  # fmt: skip
        tol = pod("a", "tol", {"nvidia.com/gpu": "8"})
        tol["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "research"}]
        tol["spec"]["nodeSelector"] = {"team": "research"}  # only node-02, whose taint it tolerates
        odd = pod("a", "odd", {"nvidia.com/gpu": "1"})
        odd["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]}]
        }}}  # fmt: skip
        for p in (sel, aff, tol, odd):
            await port.create(PODS, p, "a")
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            await until(lambda: ctl.stats.binds >= 3 and not ctl.inflight, 30, "three pods to be bound")
            await asyncio.sleep(0.5)
            got = {o["metadata"]["name"]: o["spec"].get("nodeName") for o in (await port.list(PODS, "a"))[0]}
            assert got == {"sel": "node-01", "aff": "node-00", "tol": "node-02", "odd": None}
            assert "matchFields: not supported" in ctl._pods.bad["a/odd"]  # pending, with the reason
        finally:
            await stop(port, run)

    asyncio.run(asyncio.wait_for(go(), 60))
