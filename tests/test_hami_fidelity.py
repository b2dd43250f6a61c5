"""Issue 12's findings, each against the behaviour of HAMi v2.10.0 (design/hami-interop.md): MIG nodes, pods of
any shape accounted, HAMi's per-pod selection annotations, its request rules, its config and webhook
injections, strict register decoding and Go's encoder order. (Node-lock rules: tests/test_binder.py; the
corpus of HAMi's own test cases: tests/test_hami_corpus.py.)"""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from fairgpu import hamiconfig
from fairgpu.catalog import load_profile
from fairgpu.cli import app
from fairgpu.errors import FormatError, HamiConfigError, RequestError
from fairgpu.k8s import hami
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.port import EVENTS, NODES, PODS, QUEUES
from fairgpu.k8s.translate import NodeInputs, node_spec, pod_info, refused_gpus
from fairgpu.k8s.webhook import hami_injections, mutate
from fairgpu.model import GpuRequest, PodSpec, gpu_request
from fairgpu.sim import scenario as scenario_mod
from fairgpu.state import ClusterState
from fake_kubelet import GPU_MEM, SPLIT, FakeNodes
from test_live_scheduling import node, pod, stop, until

A100 = "NVIDIA A100-SXM4-80GB"


def _mixed_node(profiles: tuple[hami.MigProfile, ...] = ()) -> dict:
    """node-01: one MIG-mode card (with these MIG profiles) and one ordinary sharing card."""
    devices = [
        hami.RegisteredGpu("GPU-01-mig", 7, GPU_MEM, 100, A100, healthy=True, mode="mig", mig_profiles=profiles),
        hami.RegisteredGpu("GPU-01-1", SPLIT, GPU_MEM, 100, A100, index=1, healthy=True),
    ]
    obj = node(1)
    obj["metadata"]["annotations"][hami.NODE_REGISTER] = hami.encode_register(devices)
    return obj


def _foreign(name: str, containers: list[dict], allocated: str, init: list[dict] | None = None) -> dict:
    """A pod HAMi's own scheduler placed on node-00, running, with its record."""
    return {
        "metadata": {
            "name": name,
            "namespace": "other",
            "annotations": {hami.VGPU_NODE: "node-00", hami.ALLOCATED: allocated, hami.BIND_PHASE: "success"},
        },
        "spec": {
            "schedulerName": "hami-scheduler",
            "nodeName": "node-00",
            "initContainers": init or [],
            "containers": containers,
        },
        "status": {"phase": "Running"},
    }


def _c(name: str, limits: dict) -> dict:
    return {"name": name, "image": "x", "resources": {"limits": limits}}


def test_every_pod_on_a_hami_node_is_accounted_and_mig_cards_are_refused(fake_api, tmp_path):
    """Finding 2: pods HAMi placed with two GPU containers, an init container, cores over 100 or an unreadable
    record all hold their cards (the unreadable one fully, with an Event and the unaccounted gauge).
    Finding 1: node-01's MIG card is never scheduled (an Event on the node says why) while its ordinary card
    is. Finding 4: use-gpuuuid in Kubernetes mode. Whole-GPU pods of ours then land only on free cards."""

    async def go() -> None:
        port = await KubeClient.connect(fake_api.kubeconfig(str(tmp_path / "kc")))
        await port.create(NODES, node(0))
        await port.create(NODES, _mixed_node())
        await port.create(QUEUES, {"metadata": {"name": "q"}, "spec": {"namespaces": ["a"]}})
        gpu = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "10"}
        foreign = [
            # two GPU containers: each its own card (the old code could not read the pod and left both free)
            _foreign("two", [_c("a", gpu), _c("b", gpu)], "GPU-00-0,NVIDIA,1000,10:;GPU-00-1,NVIDIA,1000,10:;"),
            # an init container's card and an app container sharing it with another entry
            _foreign("init", [_c("a", gpu)], "GPU-00-2,NVIDIA,1000,10:;GPU-00-2,NVIDIA,2000,20:;", [_c("i", gpu)]),
            # cores over 100 as written by hand: the card counts as fully used
            _foreign("hot", [_c("a", gpu)], "GPU-00-3,NVIDIA,1000,150:;"),
            # an unreadable record: the card it names counts as fully used
            _foreign("junk", [_c("a", gpu)], "GPU-00-4,NVIDIA,lots,10:;"),
        ]
        for obj in foreign:
            await port.create(PODS, obj, "other")
        ours = [pod("a", f"w{i}", {"nvidia.com/gpu": "1"}) for i in range(6)]
        pinned = pod("a", "pinned", {"nvidia.com/gpu": "1"})
        pinned["metadata"]["annotations"] = {hami.USE_GPUUUID: "GPU-00-7", hami.NOUSE_GPUUUID: "GPU-00-6"}
        for obj in [*ours, pinned]:
            await port.create(PODS, obj, "a")
        nodes = FakeNodes(port)
        kubelet = asyncio.create_task(nodes.run())
        ctl = Controller(port, load_profile("fairgpu"))
        run = asyncio.create_task(ctl.run())
        try:
            # free: GPU-00-5, -6, -7 and GPU-01-1 → four whole GPUs for seven pods
            await until(lambda: ctl.stats.binds == 4 and not ctl.inflight, 30, "four binds")
            await asyncio.sleep(0.5)  # nothing more binds
            assert ctl.stats.binds == 4
            listed, _ = await port.list(PODS)
            used = {}
            for obj in listed:
                ann = obj["metadata"].get("annotations") or {}
                if obj["metadata"]["namespace"] == "a" and obj["spec"].get("nodeName"):
                    used[obj["metadata"]["name"]] = [d.uuid for d in hami.decode_devices(ann[hami.ALLOCATED])[0]]
            cards = sorted(u for us in used.values() for u in us)
            assert cards == ["GPU-00-5", "GPU-00-6", "GPU-00-7", "GPU-01-1"], used
            assert used.get("pinned") in (None, ["GPU-00-7"])  # use-gpuuuid / nouse-gpuuuid honoured
            assert set(ctl.unaccounted) == {"other/hot", "other/junk"}, ctl.unaccounted
            assert all(k in ctl.fixed for k in ("other/two", "other/init", "other/hot", "other/junk"))
            await until(lambda: len(nodes.allocations) == 4, 20, "HAMi's device plugin to serve our pods")
            events, _ = await port.list(EVENTS)
            reasons = {(e["involvedObject"]["name"], e["reason"]) for e in events}
            assert ("junk", "HAMiAllocationUnaccounted") in reasons and ("hot", "HAMiAllocationUnaccounted") in reasons
            assert ("node-01", "GPUsNotScheduled") in reasons
            assert not nodes.violations, nodes.violations
        finally:
            await stop(port, run, kubelet)

    asyncio.run(asyncio.wait_for(go(), 60))


def test_mig_cards_without_profiles_are_left_out_with_a_reason_and_mixed_nodes_keep_the_rest():
    inputs = NodeInputs.of(_mixed_node())
    spec = node_spec(inputs)
    assert [g.uuid for g in spec.gpus] == ["GPU-01-1"]  # the old code scheduled the MIG card as a shared one
    assert "GPU-01-mig" in refused_gpus(inputs) and "migProfiles" in refused_gpus(inputs)
    assert refused_gpus(NodeInputs.of(node(0))) is None
    with_profiles = NodeInputs.of(_mixed_node((hami.MigProfile("1g.10gb", 9856, 14, 1, ((0, 1), (1, 1))),)))
    spec = node_spec(with_profiles)
    assert [(g.uuid, g.mode, len(g.mig)) for g in spec.gpus] == [("GPU-01-mig", "mig", 1), ("GPU-01-1", "hami-core", 0)]
    assert refused_gpus(with_profiles) is None


def test_hami_request_rules_table():
    """Finding 5: the table of issue 12, HAMi's result on the right."""
    st = ClusterState([node_spec(node(0))])

    def mem(req: dict) -> int:
        return st.placement_for(PodSpec(gpu=gpu_request(req)), 0, (0,)).mem_mib[0]

    assert mem({"nvidia.com/gpucores": "100", "nvidia.com/gpumem": "4000"}) == 4000  # old: 81920
    assert mem({"nvidia.com/gpucores": "100", "nvidia.com/gpumem-percentage": "50"}) == 40960  # old: 81920
    assert gpu_request({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "0"}).cores == 0  # old: 100
    assert gpu_request({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "0"}).cores == 0  # old: 100
    assert gpu_request({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}).cores == 100  # old: refused
    with pytest.raises(RequestError, match=r"nvidia\.com/gpumem"):
        gpu_request({"nvidia.com/gpumem": "10Gi"})  # old: 10240 MiB
    assert gpu_request({"nvidia.com/gpumem": "1Gi"}).mem_mib == 1073741824  # old: 1024
    two = pod_info(
        {
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {"containers": [_c("a", {"nvidia.com/gpu": "1"}), _c("b", {"nvidia.com/gpu": "2"})]},
        }
    )
    assert two.gpu_containers == (0, 1)  # old: RequestError, so a running one was never accounted
    # never bind what HAMi's device plugin cannot serve: the kubelet calls it only for an nvidia.com/gpu limit
    alone = {
        "metadata": {"name": "p", "namespace": "n"},
        "spec": {"containers": [_c("a", {"nvidia.com/gpumem": "10"})]},
    }
    assert "nvidia.com/gpu is missing" in pod_info(alone).problem


def test_selection_annotations_in_kubernetes_mode():
    """Finding 4: HAMi's per-pod annotations reach the engine's PodSpec with HAMi's semantics."""
    ann = {
        hami.USE_GPUUUID: " GPU-a , GPU-b ",
        hami.NOUSE_GPUUUID: "GPU-b",
        hami.USE_GPUTYPE: "A100,",
        hami.NODE_POLICY: "spread",
        hami.GPU_POLICY: "binpack, numa ,mutex",
        hami.VGPU_MODE: "hami-core",
    }
    obj = {"metadata": {"name": "p", "namespace": "n", "annotations": ann}, "spec": {"containers": [_c("a", {})]}}
    spec = pod_info(obj).spec
    assert spec.allows_uuid("GPU-a") and not spec.allows_uuid("GPU-b") and not spec.allows_uuid("GPU-c")
    assert spec.allows_model("NVIDIA A100-SXM4-80GB") and not spec.allows_model("NVIDIA H100")
    # the chain as written (HAMi tells a chain from a single policy by its commas)
    assert (spec.node_policy, spec.gpu_policy, spec.gpu_mutex) == ("spread", "binpack, numa ,mutex", True)
    assert spec.allows_mode("hami-core") and not spec.allows_mode("mps")
    gpus = {"nvidia.com/gpu": "2"}
    bad = {**ann, hami.GPU_POLICY: "fastest", hami.NUMA_BIND: "true"}
    obj = {"metadata": {"name": "p", "namespace": "n", "annotations": bad}, "spec": {"containers": [_c("a", gpus)]}}
    problem = pod_info(obj).problem
    assert "hami.io/gpu-scheduler-policy" in problem and "nvidia.com/numa-bind" not in problem
    assert pod_info(obj).spec.numa_bind  # scheduled with HAMi's NUMA rule (framework/cardfit.py)


def test_register_decoding_is_as_strict_as_hamis_and_encodes_in_gos_order():
    """Finding 7."""
    for value in ("", "GPU-a,10,4096,100,NVIDIA-T4,0,notabool:", "GPU-a,10,4096,100,NVIDIA-T4,0,true,-1,hami-core:"):
        with pytest.raises(FormatError):
            hami.decode_register(value)
    with pytest.raises(FormatError, match="not an integer"):
        hami.decode_register('[{"id":"GPU-a","count":"10","devmem":1,"type":"NVIDIA"}]')
    d = hami.RegisteredGpu("GPU-a", 10, 4096, 100, "NVIDIA-T4", numa=1, healthy=True, index=2)
    encoded = hami.encode_register([d])
    assert encoded == (
        '[{"id":"GPU-a","index":2,"count":10,"devmem":4096,"devcore":100,"type":"NVIDIA-T4","numa":1,'
        '"mode":"hami-core","health":true}]'
    )
    assert hami.decode_register(encoded) == [d]


CONFIG = """
apiVersion: v1
kind: ConfigMap
metadata: {name: hami-scheduler-device}
data:
  device-config.yaml: |-
    nvidia:
      resourceCountName: example.com/vgpu
      resourceMemoryName: example.com/vmem
      resourceMemoryPercentageName: example.com/vmem-pct
      resourceCoreName: example.com/vcores
      resourcePriorityName: example.com/prio
      defaultMemory: 2048
      defaultCores: 5
      defaultGPUNum: 2
      deviceSplitCount: 4
      deviceMemoryScaling: 1.5
      gpuCorePolicy: force
      runtimeClassName: nvidia
      migProfileAllowlist: []
    nodeLockExpire: 90s
"""


def test_hami_config_drives_requests_lock_expiry_and_webhook_injections(tmp_path):
    """Finding 6: HAMi's ConfigMap is read (resource names, defaults, lock expiry), and the webhook injects
    what HAMi's would (runtimeClassName, CUDA_TASK_PRIORITY, GPU_CORE_UTILIZATION_POLICY)."""
    path = tmp_path / "hami.yaml"
    path.write_text(CONFIG)
    cfg = hamiconfig.load(path)
    assert cfg.lock_expiry.total_seconds() == 90
    rules = cfg.rules()
    assert gpu_request({"example.com/vcores": "30"}, rules) == GpuRequest(2, 30, 2048, 100)  # defaultGPUNum 2
    assert gpu_request({"nvidia.com/gpu": "1"}, rules) is None  # the default names mean nothing here
    obj = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "example.com/prio": "0"}}},
                {"name": "side", "env": [{"name": "X", "value": "1"}]},
            ]
        },
    }
    ops = hami_injections(obj, cfg)
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"} not in ops  # no GPU by its names
    obj["spec"]["containers"][0]["resources"]["limits"]["example.com/vgpu"] = "1"
    ops = hami_injections(obj, cfg)
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"} in ops
    env0 = [{"name": "CUDA_TASK_PRIORITY", "value": "0"}, {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}]
    assert {"op": "add", "path": "/spec/containers/0/env", "value": env0} in ops
    side = {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}
    assert {"op": "add", "path": "/spec/containers/1/env/-", "value": side} in ops
    assert all(op in mutate(obj, "u", "fairgpu", config=cfg) for op in ops)  # the mutating webhook carries them
    mem_only = {"metadata": {}, "spec": {"containers": [_c("a", {"example.com/vmem": "100"})]}}
    added = {op["path"]: op["value"] for op in mutate(mem_only, "u", "fairgpu", config=cfg)}
    assert added["/spec/containers/0/resources/limits/example.com~1vgpu"] == "2"  # defaultGPUNum, by its names
    obj["spec"]["runtimeClassName"] = "mine"
    assert not any(op["path"] == "/spec/runtimeClassName" for op in hami_injections(obj, cfg))
    (tmp_path / "bad.yaml").write_text("nvidia: {defaultCores: 200}\n")
    with pytest.raises(HamiConfigError, match="defaultCores"):
        hamiconfig.load(tmp_path / "bad.yaml")
    result = CliRunner().invoke(app, ["run", "--hami-config", str(tmp_path / "bad.yaml")])
    assert result.exit_code == 2 and "--hami-config" in result.output and "defaultCores" in result.output


def test_scenario_hami_key_registers_nodes_as_hamis_device_plugin_would():
    doc = {
        "name": "h",
        "horizon": 10,
        "hami": {"deviceSplitCount": 3, "deviceMemoryScaling": 2, "defaultGPUNum": 1, "defaultMemory": 1000},
        "cluster": {
            "nodes": [{"count": 1, "cpu": 8, "memory": "64Gi", "gpus": 2, "gpu_model": "T4", "gpu_memory": "16Gi"}]
        },
        "queues": [{"name": "q"}],
        "workloads": [
            {"queue": "q", "duration": 1, "requests": {"nvidia.com/gpucores": 10}, "gpu_scheduler_policy": "mutex"}
        ],
    }
    sc = scenario_mod.build(doc)
    assert sc.nodes[0].split_count == 3 and sc.nodes[0].gpus[0].memory_mib == 32768
    p = sc.workloads[0].pods[0]
    assert (p.gpu.mem_mib, p.gpu.cores, p.gpu_mutex) == (1000, 10, True)
    doc["hami"] = {"deviceCoreScaling": 2}  # devcore 200, as HAMi's device plugin registers it (old: refused)
    sc = scenario_mod.build(doc)
    assert sc.nodes[0].gpus[0].cores == 200 and ClusterState(sc.nodes).capacity_vector()[0] == 4.0
    doc["hami"] = {"deviceSplitCount": 0}
    with pytest.raises(Exception, match=r"hami"):
        scenario_mod.build(doc)


def test_init_container_usage_collapses_as_hamis_accounting_does():
    """HAMi's CollapseInitContainerUsage: init containers run before the app containers, so a card holds
    max(init peak, app sum): here 50000 MiB and 60 cores of GPU-00-0 in one task, not 90000 MiB in two."""
    from fairgpu.k8s.records import hold, holdings

    gpu = {"nvidia.com/gpu": "1"}
    record = "GPU-00-0,NVIDIA,50000,60:;GPU-00-0,NVIDIA,30000,10:;GPU-00-0,NVIDIA,10000,20:GPU-00-1,NVIDIA,10,0:;"
    obj = _foreign("p", [_c("a", gpu), _c("b", gpu)], record, [_c("i", gpu)])
    st = ClusterState([node_spec(node(0))])
    p = pod_info(obj)
    placements, problem = holdings(p, st, 0)
    keys, over = hold(st, p.key, placements)
    assert problem is None and not over
    assert (int(st.gpu_mem_free[0, 0]), int(st.gpu_cores_free[0, 0]), int(st.gpu_tasks[0, 0])) == (
        GPU_MEM - 50000,  # max(50000, 30000 + 10000)
        40,  # max(60, 10 + 20)
        2,  # max(1, 2 app entries)
    )
    assert int(st.gpu_tasks[0, 1]) == 1 and len(keys) == 4  # CPU/memory, two tasks on GPU-00-0, one on GPU-00-1
