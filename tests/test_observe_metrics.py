"""/metrics, scraped over HTTP and parsed with prometheus_client's parser, agrees with the engine."""

from __future__ import annotations

import urllib.request
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fairgpu import resources as r
from fairgpu.catalog import load_profile
from fairgpu.observe.server import Background
from fairgpu.sim import scenario as scenario_mod
from fairgpu.sim.serve import replay_app

MIB = float(r.MIB)
# Mixed fractional and whole-GPU work under a two-level tree with a guarantee and a limit.
SCENARIO = {
    "name": "metrics",
    "horizon": "2h",
    "seed": 1,
    "cluster": {"nodes": [{"count": 2, "name": "n", "gpus": 4, "gpu_model": "A100-80GB", "gpu_memory": "80Gi",
                           "cpu": 64, "memory": "512Gi"}]},
    "queues": [
        {"name": "org"},
        {"name": "a", "parent": "org", "guaranteed": {"nvidia.com/gpu": 2}},
        {"name": "b", "parent": "org", "limit": {"nvidia.com/gpu": 3}},
        {"name": "c"},
    ],
    "workloads": [
        {"queue": "a", "name": "a", "count": 6, "every": "1m", "duration": "30m",
         "requests": {"nvidia.com/gpu": 1, "cpu": "4", "memory": "16Gi"}},
        {"queue": "b", "name": "b", "count": 10, "every": "30s", "duration": "20m",
         "requests": {"nvidia.com/gpucores": 30, "nvidia.com/gpumem": 10240, "cpu": "1", "memory": "4Gi"}},
        {"queue": "c", "name": "c", "count": 3, "pods": 2, "duration": "40m",
         "requests": {"nvidia.com/gpu": 1, "cpu": "2", "memory": "8Gi"}},
    ],
}  # fmt: skip
EXPECTED = {
    "fairgpu_schedule_attempts": {"result", "profile"},
    "fairgpu_scheduling_attempt_duration_seconds": {"profile"},
    "fairgpu_pending_pods": {"queue", "state"},
    "fairgpu_preemptions": {"reason"},
    "fairgpu_pod_scheduling_sli_duration_seconds": set(),
    "fairgpu_queue_usage": {"queue", "resource"},
    "fairgpu_queue_fair_share": {"queue", "resource"},
    "fairgpu_queue_guaranteed": {"queue", "resource"},
    "fairgpu_queue_limit": {"queue", "resource"},
    "fairgpu_queue_pending_workloads": {"queue"},
    "fairgpu_queue_admission_wait_time_seconds": {"queue"},
    "fairgpu_gpu_cores_allocated_ratio": {"node", "gpu_uuid", "gpu_index", "model"},
    "fairgpu_gpu_memory_allocated_bytes": {"node", "gpu_uuid", "gpu_index", "model"},
    "fairgpu_gpu_memory_total_bytes": {"node", "gpu_uuid", "gpu_index", "model"},
    "fairgpu_gpu_shared_pods": {"node", "gpu_uuid", "gpu_index", "model"},
    "fairgpu_cluster_gpus": {"state"},
    "fairgpu_idle_gpus": {"cause"},
    "fairgpu_fairness_jain_index": set(),
    "fairgpu_leader_election_master_status": {"name"},
}


@pytest.fixture(scope="module")
def scraped():
    app, source = replay_app(scenario_mod.build(SCENARIO), load_profile("fairgpu"))
    with Background(app) as bg:
        urllib.request.urlopen(f"{bg.url}/api/info?t=600", timeout=30).read()  # move the replay to t=600
        with urllib.request.urlopen(f"{bg.url}/metrics", timeout=30) as resp:
            text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return families, source


def samples(families, name: str, suffix: str = "") -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value for s in families[name].samples if s.name == name + suffix}


def test_every_documented_metric_is_exposed_with_its_labels(scraped):
    families, _ = scraped
    for name, labels in EXPECTED.items():
        assert name in families, name
        for s in families[name].samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)


def test_per_gpu_allocation_matches_the_placements_pods_hold(scraped):
    families, source = scraped
    st = source.sched.state
    cores, mem, pods = defaultdict(float), defaultdict(float), defaultdict(int)
    for key in st.placed_keys():
        p = st.placement(key)
        for slot, c, m in zip(p.slots, p.cores, p.mem_mib, strict=True):
            cores[(st.node_names[p.node], str(slot))] += c / 100
            mem[(st.node_names[p.node], str(slot))] += m * MIB
            pods[(st.node_names[p.node], str(slot))] += 1
    assert sum(pods.values()) > 0 and any(0 < c < 1 for c in cores.values())  # shared GPUs are in play
    got = {name: {} for name in ("cores", "mem", "pods", "total")}
    for metric, into in (
        ("fairgpu_gpu_cores_allocated_ratio", got["cores"]),
        ("fairgpu_gpu_memory_allocated_bytes", got["mem"]),
        ("fairgpu_gpu_shared_pods", got["pods"]),
        ("fairgpu_gpu_memory_total_bytes", got["total"]),
    ):
        for labels, value in samples(families, metric).items():
            d = dict(labels)
            node = st.nodes[st.node_index[d["node"]]]
            assert d["gpu_uuid"] == node.gpus[int(d["gpu_index"])].uuid
            assert d["model"] == "A100-80GB"
            into[(d["node"], d["gpu_index"])] = value
    assert len(got["cores"]) == st.total_gpus == 8
    for gpu in got["cores"]:
        assert got["cores"][gpu] == pytest.approx(cores.get(gpu, 0.0))
        assert got["mem"][gpu] == pytest.approx(mem.get(gpu, 0.0))
        assert got["pods"][gpu] == pods.get(gpu, 0)
        assert got["total"][gpu] == 80 * 1024 * MIB
    cluster = {dict(k)["state"]: v for k, v in samples(families, "fairgpu_cluster_gpus").items()}
    assert cluster["allocated"] == pytest.approx(sum(cores.values()))
    assert cluster["free"] == sum(1 for gpu in got["pods"] if got["pods"][gpu] == 0)
    assert cluster["allocated"] + cluster["free"] + cluster["fragmented"] == pytest.approx(8)
    idle = {dict(k)["cause"]: v for k, v in samples(families, "fairgpu_idle_gpus").items()}
    assert idle == pytest.approx(source.sched.idle_gpus(source.now))
    assert sum(idle.values()) == pytest.approx(8 - cluster["allocated"])


def test_queue_gauges_match_the_engine(scraped):
    families, source = scraped
    sched = source.sched
    names = sched.tree.names()
    usage = samples(families, "fairgpu_queue_usage")
    fair = samples(families, "fairgpu_queue_fair_share")
    for q, name in enumerate(names):
        assert usage[(("queue", name), ("resource", "gpu"))] == pytest.approx(sched.view.usage[q, r.DIM_GPU])
        assert usage[(("queue", name), ("resource", "cpu"))] == pytest.approx(sched.view.usage[q, r.DIM_CPU] / 1000)
        assert fair[(("queue", name), ("resource", "gpu"))] == pytest.approx(sched.view.entitled[q, r.DIM_GPU])
    # the org's usage is its children's
    assert usage[(("queue", "org"), ("resource", "gpu"))] == pytest.approx(
        usage[(("queue", "a"), ("resource", "gpu"))] + usage[(("queue", "b"), ("resource", "gpu"))]
    )
    assert samples(families, "fairgpu_queue_guaranteed")[(("queue", "a"), ("resource", "gpu"))] == 2
    assert samples(families, "fairgpu_queue_limit")[(("queue", "b"), ("resource", "gpu"))] == 3
    # unconstrained dimensions are left out rather than exported as +Inf
    assert (("queue", "c"), ("resource", "gpu")) not in samples(families, "fairgpu_queue_limit")
    pending = samples(families, "fairgpu_queue_pending_workloads")
    for q, name in enumerate(names):
        if sched.tree.is_leaf[q]:
            assert pending[(("queue", name),)] == len(sched.backlogs[q])
    idx = sched.tree.index
    assert pending[(("queue", "org"),)] == len(sched.backlogs[idx["a"]]) + len(sched.backlogs[idx["b"]])
    unplaced = sum(v for k, v in samples(families, "fairgpu_pending_pods").items() if ("state", "unplaced") in k)
    assert unplaced == sum(len(e.workload.pods) - len(e.placed) for e in sched.pending.values())


def test_counters_and_histograms_count_what_the_driver_saw(scraped):
    families, source = scraped
    # every start, a preempted workload's restarts included (the simulator counts runs per workload)
    started = sum(source.sim._run.values())
    attempts = samples(families, "fairgpu_schedule_attempts", "_total")
    assert attempts[(("profile", "fairgpu"), ("result", "scheduled"))] == started > 0
    assert samples(families, "fairgpu_pod_scheduling_sli_duration_seconds", "_count")[()] == started
    per_queue = samples(families, "fairgpu_queue_admission_wait_time_seconds", "_count")
    assert sum(per_queue.values()) == started
    cycles = samples(families, "fairgpu_scheduling_attempt_duration_seconds", "_count")
    assert 0 < cycles[(("profile", "fairgpu"),)] <= source.sim.cycles
    decided = sum(samples(families, "fairgpu_preemptions", "_total").values())
    carried_out = sum(source.sim.preempted.values())
    assert decided >= carried_out > 0, (decided, carried_out)  # evictions are carried out after their grace period
    assert all(dict(k)["reason"] == "preempted" for k in samples(families, "fairgpu_preemptions", "_total"))
    assert samples(families, "fairgpu_leader_election_master_status")[(("name", "fairgpu"),)] == 1
    assert 0 < samples(families, "fairgpu_fairness_jain_index")[()] <= 1
