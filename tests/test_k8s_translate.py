"""HAMi annotation formats and Node/Pod translation (design/hami-interop.md §2–3)."""

from __future__ import annotations

import copy

import pytest

from fairgpu.errors import RequestError
from fairgpu.k8s import hami
from fairgpu.k8s.binder import device_string
from fairgpu.k8s.queues import queue_from_cr
from fairgpu.k8s.translate import NodeInputs, node_spec, pod_info

JSON_REGISTER = (
    '[{"id":"GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec","count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","mode":"hami-core","health":true},'
    '{"id":"GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448","index":1,"count":10,"devmem":32768,"devcore":100,'
    '"type":"NVIDIA-Tesla V100-PCIE-32GB","numa":1,"mode":"hami-core"}]'
)
LEGACY_7 = (
    "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
    "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
)
LEGACY_9 = (
    "GPU-c68a7b57-2e7c-82e7-5544-ba780116e140,10,4096,100,NVIDIA-NVIDIA GeForce GTX 1050,0,true,0,hami-core:"
    "GPU-331e028c-15b8-e878-7c68-0c2d231b0932,10,4096,100,NVIDIA-NVIDIA GeForce GTX 1050,0,true,1,hami-core:"
)


def test_register_json_omitempty_means_unhealthy_and_zero():
    a, b = hami.decode_register(JSON_REGISTER)
    assert (a.index, a.numa, a.healthy, a.memory_mib, a.count) == (0, 0, True, 32768, 10)
    assert (b.index, b.numa, b.healthy) == (1, 1, False)  # no "health" key: unhealthy


@pytest.mark.parametrize("value", [LEGACY_7, LEGACY_9])
def test_register_legacy_text(value):
    devices = hami.decode_register(value)
    assert len(devices) == 2 and all(d.healthy and d.count == 10 for d in devices)
    assert devices[1].index == (1 if value is LEGACY_9 else 0)


def test_register_round_trip_and_errors():
    devices = hami.decode_register(LEGACY_9)
    assert hami.decode_register(hami.encode_register(devices)) == devices
    with pytest.raises(hami.FormatError, match="node-nvidia-register"):
        hami.decode_register("GPU-x,10,4096:")


def test_device_strings_keep_empty_segments_and_tolerate_missing_semicolon():
    s = "GPU-0fc3,NVIDIA,3000,0:;GPU-0fc3,NVIDIA,5000,0:;"
    decoded = hami.decode_devices(s)
    assert [[d.memory_mib for d in c] for c in decoded] == [[3000], [5000], []]  # HAMi: the trailing ";" too
    assert hami.encode_devices(decoded[:2]) == s
    assert hami.decode_devices(";GPU-a,NVIDIA,20000,30:GPU-b,NVIDIA,20000,30:")[1][1].uuid == "GPU-b"
    assert hami.decode_devices(";;") == [[], [], []]


def test_node_from_hami_register_with_cordon():
    node = {
        "metadata": {
            "name": "n1",
            "annotations": {
                hami.NODE_REGISTER: LEGACY_7,
                hami.DEVICE_CORDON: "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec",
            },
        },
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "20"}},
    }
    spec = node_spec(node)
    assert (spec.cpu_m, spec.memory_mib, spec.split_count) == (64000, 262144, 10)
    assert [g.healthy for g in spec.gpus] == [False, True]
    node["status"]["allocatable"]["nvidia.com/gpu"] = "0"  # HAMi drops a node whose plugin reports nothing
    assert node_spec(node).gpus == ()


def test_node_inputs_ignore_the_lock_and_see_inventory_changes():
    """The controller keeps a node's parsed spec while its inputs compare equal: HAMi's lock and handshake
    must not count as a change, anything node_spec reads must."""
    node = {
        "metadata": {"name": "n1", "annotations": {hami.NODE_REGISTER: LEGACY_7}, "labels": {"zone": "a"}},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "20"}},
    }
    before = NodeInputs.of(node)
    locked = copy.deepcopy(node)
    locked["metadata"]["annotations"][hami.NODE_LOCK] = "2026-01-01T00:00:00Z,ns,p"
    locked["metadata"]["annotations"]["hami.io/node-handshake"] = "Requesting_2026-01-01 00:00:00"
    locked["metadata"]["resourceVersion"] = "42"
    assert NodeInputs.of(locked) == before
    changes = [
        ("metadata", "annotations", hami.DEVICE_CORDON, "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"),
        ("metadata", "annotations", hami.NODE_REGISTER, LEGACY_7.replace("32768", "16384")),
        ("metadata", "labels", "zone", "b"),
        ("status", "allocatable", "nvidia.com/gpu", "0"),
        ("spec", None, "unschedulable", True),
    ]
    for top, sub, key, value in changes:
        changed = copy.deepcopy(node)
        where = changed.setdefault(top, {})
        (where.setdefault(sub, {}) if sub else where)[key] = value
        assert NodeInputs.of(changed) != before, key
        assert node_spec(NodeInputs.of(changed)) == node_spec(changed) != node_spec(node), key


def test_node_without_hami_uses_gpu_feature_discovery():
    node = {
        "metadata": {
            "name": "n2",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-H100", "nvidia.com/gpu.memory": "81559"},
        },
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "4"}},
        "spec": {"unschedulable": True},
    }
    spec = node_spec(node)
    assert [(g.model, g.memory_mib) for g in spec.gpus] == [("NVIDIA-H100", 81559)] * 4
    assert spec.split_count == 1 and not spec.schedulable  # nothing enforces sharing without HAMi


def _pod(containers, init=(), labels=None, annotations=(), **spec):
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"initContainers": list(init), "containers": list(containers), **spec},
    }


def _c(name, limits=None, requests=None):
    return {"name": name, "resources": {"limits": limits or {}, "requests": requests or {}}}


def test_pod_requests_defaults_gang_queue_runtime():
    obj = _pod(
        [_c("a", {"nvidia.com/gpu": "2"}, {"cpu": "2", "memory": "1Gi"}), _c("b", requests={"cpu": "500m"})],
        init=[_c("init", requests={"cpu": "4"})],
        labels={"fairgpu.io/queue": "q", "scheduling.x-k8s.io/pod-group": "g", "fairgpu.io/user": "ann"},
        annotations={"fairgpu.io/expected-runtime": "2h", "fairgpu.io/min-members": "3"},
        priority=7,
        schedulerName="fairgpu",
    )
    p = pod_info(obj)
    assert p.spec.gpu.count == 2 and p.spec.gpu.cores == 100  # gpu alone: whole exclusive cards
    assert p.spec.cpu_m == 4000  # max(sum(app) = 2500, max(init) = 4000)
    assert (p.gpu_container, p.containers) == (1, 3)
    assert (p.queue_label, p.group, p.min_members, p.duration, p.priority, p.user) == ("q", "g", 3, 7200.0, 7, "ann")
    devices = [hami.DeviceUse("GPU-a", "NVIDIA", 100, 100), hami.DeviceUse("GPU-b", "NVIDIA", 100, 100)]
    assert device_string(p, devices) == ";GPU-a,NVIDIA,100,100:GPU-b,NVIDIA,100,100:;;"


def test_a_pod_without_priority_ranks_below_priority_one_and_runs_from_when_the_kubelet_took_it():
    """No spec.priority is priority 0 (kube's default), below a PriorityClass of value 1; a running pod's start
    is status.startTime (what min_runtime protects and the twin replays), its creation time only before that."""
    created = {"creationTimestamp": "2026-01-01T00:00:00Z"}
    plain = _pod([_c("a", {"nvidia.com/gpu": "1"})])
    plain["metadata"].update(created)
    one = copy.deepcopy(plain)
    one["spec"]["priority"] = 1
    assert (pod_info(plain).priority, pod_info(one).priority) == (0, 1)
    assert pod_info(plain).started == pod_info(plain).created == 1767225600.0
    plain["status"] = {"phase": "Running", "startTime": "2026-01-01T00:10:00Z"}
    assert (pod_info(plain).created, pod_info(plain).started) == (1767225600.0, 1767226200.0)


def test_pod_problems_name_the_field_and_do_not_stop_translation():
    """A GPU request fairgpu will not schedule is the pod's `problem`, not an exception: once bound (by
    anyone) the pod must still be read and accounted."""
    p = pod_info(_pod([_c("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10Gi"})]))
    assert p.problem.startswith("spec.containers[0].resources.nvidia.com/gpumem:")
    p = pod_info(_pod([_c("a", {"nvidia.com/gpu": "1"}), _c("b", {"nvidia.com/gpu": "1"})]))
    assert p.problem is None and p.gpu_containers == (0, 1)  # several GPU app containers: scheduled
    p = pod_info(_pod([_c("b", {"nvidia.com/gpu": "1"})], init=[_c("i", {"nvidia.com/gpu": "1"})]))
    assert "2 containers ask for GPUs, one of them an init container" in p.problem
    with pytest.raises(RequestError, match=r"spec.containers\[0\].resources.cpu"):
        pod_info(_pod([_c("a", requests={"cpu": "lots"})]))


def test_queue_cr_maps_scenario_keys_and_names_bad_fields():
    q = queue_from_cr(
        {
            "metadata": {"name": "team"},
            "spec": {
                "parent": "root",
                "weight": 2,
                "guaranteed": {"nvidia.com/gpu": 8},
                "usage_half_life": "1h",
                "fair_within": "users",
                "namespaces": ["a", "b"],
            },
        }
    )
    assert (q.spec.name, q.spec.parent, q.spec.weight, q.spec.usage_half_life, q.spec.fair_within) == (
        "team",
        "root",
        2,
        3600.0,
        "users",
    )
    assert q.spec.guaranteed[0] == 8 and q.namespaces == ("a", "b")
    with pytest.raises(ValueError, match=r"^spec.weight"):
        queue_from_cr({"metadata": {"name": "x"}, "spec": {"weight": 0}})
    with pytest.raises(ValueError, match=r"^spec.colour"):
        queue_from_cr({"metadata": {"name": "x"}, "spec": {"colour": "red"}})
    # A bare memory number would be bytes: a 512-byte limit would block the queue outright.
    with pytest.raises(ValueError, match=r"^spec.limit: .*needs a unit"):
        queue_from_cr({"metadata": {"name": "x"}, "spec": {"limit": {"memory": 512}}})
    ok = queue_from_cr({"metadata": {"name": "x"}, "spec": {"limit": {"memory": "512Gi"}}})
    assert ok.spec.limit[3] == 512 * 1024  # MiB
