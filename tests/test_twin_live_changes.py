"""The twin follows a cluster that changes under it: the parity scenario (tests/test_twin_parity.py) run live
while team-b's weight goes from 1 to 3 at 30 minutes, node-01 is deleted at 55 minutes (the pod garbage
collector deletes its pods, their Job-like controller recreates them) and comes back at 75, and a
PodDisruptionBudget refuses the eviction of b-5. The trace the controller recorded holds all three, and its
replay gives the live run's per-queue GPU-hours within 2 % and evicts the same workloads (b-5 spared,
node-01's work lost and run again); so does the simulator, told the same changes."""

from __future__ import annotations

import json

from fairgpu.catalog import load_profile
from fairgpu.k8s.port import NODES, QUEUES, Kind
from fairgpu.sim.recorded import read_fairgpu
from fairgpu.sim.runner import Simulation
from fairgpu.sim.scenario import Change
from test_live_scheduling import node
from test_twin_parity import JOBS, MINUTE, TEAMS, TOLERANCE, queue_specs, run_live, scenario, sim_figures

PDBS = Kind("policy", "v1", "poddisruptionbudgets", True)
HEAVIER_B = [q | {"weight": 3} if q["name"] == "team-b" else q for q in TEAMS]


async def protect_b5(port) -> None:
    spec = {"maxUnavailable": 0, "selector": {"matchLabels": {"job": "b-5"}}}
    await port.create(PDBS, {"metadata": {"name": "b-5"}, "spec": spec}, "b")
    budget = {"observedGeneration": 1, "disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1}
    await port.patch(PDBS, "b-5", {"status": budget}, "b", subresource="status")


async def weigh_b(port) -> None:
    await port.patch(QUEUES, "team-b", {"spec": {"weight": 3}})


async def drop_node(port) -> None:
    await port.delete(NODES, "node-01")


async def add_node(port) -> None:
    await port.create(NODES, node(1))


ACTIONS = [(0, protect_b5), (30, weigh_b), (55, drop_node), (75, add_node)]  # no job starts or ends then


def test_node_queue_and_budget_changes_replay_as_they_happened(fake_api, tmp_path):
    sc = scenario()
    sc.changes = [
        Change(30 * MINUTE, queues=queue_specs(HEAVIER_B)),
        Change(55 * MINUTE, nodes=sc.nodes[:1]),
        Change(75 * MINUTE, nodes=sc.nodes),
    ]
    sc.refusals = {"b/b-5": [60.0]}  # the controller backs off a refused victim for a minute
    sc.recreated = True  # evicted pods come back as new pods, waiting from then (Requeue, in run_live)
    profile = load_profile("fairgpu")
    simulated = sim_figures(Simulation(sc, profile).run())
    plain = sim_figures(Simulation(scenario(), profile).run())

    live, trace, _ = run_live(fake_api, tmp_path, actions=ACTIONS)
    recorded = read_fairgpu(trace)
    replayed = sim_figures(Simulation(recorded.scenario, profile, horizon=6 * 3600.0).run())

    runs = {"live": live, "simulated": simulated, "replayed": replayed}
    print("\nGPU-hours " + "".join(f"{k:>19}" for k in runs))
    for q in simulated.gpu_hours:
        print(f"{q:10}" + "".join(f"{f.gpu_hours[q]:19.3f}" for f in runs.values()))
    for k, f in runs.items():
        print(f"{k}: preempted {sorted(f.preempted)}, gangs in order {f.gang_order}")

    docs = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [len(d["nodes"]) for d in docs if d["kind"] == "nodes"] == [2, 1, 2]
    weights = [{q["name"]: q["weight"] for q in d["queues"]}["team-b"] for d in docs if d["kind"] == "queues"]
    assert weights == [1, 3]
    assert [d["workload"] for d in docs if d["kind"] == "refused"] == ["b/b-5"]
    ends = {d["workload"]: d["outcome"] for d in docs if d["kind"] == "end" and d["t"] == 55 * MINUTE}
    lost = set(ends)
    assert lost and set(ends.values()) == {"evicted"}  # lost with their node, not finished early

    # Each change mattered: b-5 spared for another of b's jobs, node-01's work lost and requeued.
    assert "b/b-5" in plain.preempted and "b/b-5" not in simulated.preempted
    assert lost <= simulated.preempted and simulated.preempted != plain.preempted
    for q, hours in live.gpu_hours.items():
        for other in (simulated, replayed):
            assert abs(other.gpu_hours[q] - hours) <= TOLERANCE * hours, (q, hours, other.gpu_hours[q])
    assert live.preempted == simulated.preempted == replayed.preempted
    assert live.gang_order == simulated.gang_order == replayed.gang_order
    assert len(recorded.scenario.workloads) == len(JOBS)
