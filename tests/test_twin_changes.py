"""A recorded trace's node and queue changes and refused evictions replay at their recorded times: a node
removed mid-run takes its work with it (evicted, requeued), a queue deleted leaves its running work where
it is and its waiting work waiting, a weight changed mid-trace changes the shares from then on, and an
eviction the cluster refused is refused in the replay too. Each trace here is recorded by the simulator
through the recorder the controller uses; tests/test_twin_parity.py records one live."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fairgpu.catalog import load_profile
from fairgpu.framework.durations import MIN_SAMPLES
from fairgpu.framework.reconfigure import successor
from fairgpu.framework.scheduler import Scheduler
from fairgpu.model import QueueSpec, QueueTree
from fairgpu.sim.recorded import read_fairgpu
from fairgpu.sim.runner import SimResult, Simulation
from fairgpu.sim.scenario import Change, Scenario
from fairgpu.sim.twin import plan, recorded
from fairgpu.twin.encode import queue_doc
from test_twin import record
from test_twin_parity import scenario as parity_scenario

MINUTE = 60.0


def rows(res: SimResult) -> dict[str, tuple]:
    return {w["workload"]: (w["first_start_s"], w["evictions"], w["state"]) for w in res.workloads}


def replay(path: Path, horizon: float) -> SimResult:
    return Simulation(read_fairgpu(path).scenario, load_profile("fairgpu"), horizon=horizon).run()


def round_trip(sc: Scenario, path: Path) -> tuple[SimResult, SimResult]:
    """The run as recorded, and its trace replayed."""
    sc.recreated = True  # as on a cluster, and so as a trace replays: evicted pods come back as new ones
    res = Simulation(sc, load_profile("fairgpu")).run()
    record(sc, path)
    return res, replay(path, res.horizon_s)


def records(path: Path, kind: str) -> list[dict]:
    return [doc for line in path.read_text().splitlines() if (doc := json.loads(line))["kind"] == kind]


def test_a_node_removed_mid_run_takes_its_work_and_the_replay_does_the_same(tmp_path):
    sc = parity_scenario()
    two = sc.nodes
    sc.changes = [Change(30 * MINUTE, nodes=two[:1]), Change(60 * MINUTE, nodes=two)]
    res, again = round_trip(sc, tmp_path / "t.jsonl")
    gone = {name for t, name, _ in res.eviction_log if t == 30 * MINUTE}
    just_before = Simulation(sc, load_profile("fairgpu"))
    just_before.run_until(30 * MINUTE - 1)
    engine = just_before.sched
    on_it = {n for n in engine.running if any(engine.state.node_names[p.node] == "node-01"
                                              for p in engine.status(n).placements)}  # fmt: skip
    # c's gang ran there; requeued at once on half the cluster, it reclaims its 8 GPUs from a and b
    assert on_it == {"c/group:big"} and gone > on_it
    ends = {e["workload"]: e["outcome"] for e in records(tmp_path / "t.jsonl", "end") if e["t"] == 30 * MINUTE}
    assert ends == dict.fromkeys(gone, "evicted")  # recorded as evicted, not as finished early
    assert [len(n["nodes"]) for n in records(tmp_path / "t.jsonl", "nodes")] == [2, 1, 2]
    assert rows(again) == rows(res)
    for q, v in res.queues.items():
        assert again.queues[q]["gpu_hours"] == pytest.approx(v["gpu_hours"], rel=1e-9)
        assert again.queues[q]["preempted"] == v["preempted"]
    assert all(state == "finished" for _, _, state in rows(res).values())  # requeued work ran again
    # The cluster had half its GPUs for half an hour: utilisation is of what there was.
    trace = read_fairgpu(tmp_path / "t.jsonl")
    assert recorded(trace, res.horizon_s).evictions == res.evictions
    assert res.utilization > Simulation(parity_scenario(), load_profile("fairgpu")).run().utilization


def test_a_weight_changed_mid_trace_changes_the_shares_from_then_on(tmp_path):
    """The same trace with one queues record added at 20 minutes (team-b's weight 1 → 3): the replay is the
    same before it and gives team-b more from then on."""
    path = tmp_path / "t.jsonl"
    record(parity_scenario(), path)
    lines = path.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line).get("t", 0) >= 20 * MINUTE)
    queues = records(path, "queues")[0]["queues"]
    heavier = [q | {"weight": 3.0} if q["name"] == "team-b" else q for q in queues]
    changed = tmp_path / "changed.jsonl"
    changed.write_text("\n".join([*lines[:at], json.dumps({"kind": "queues", "t": 20 * MINUTE, "queues": heavier}),
                                  *lines[at:]]) + "\n")  # fmt: skip
    horizon = 6 * 3600.0
    base, moved = replay(path, horizon), replay(changed, horizon)
    b = read_fairgpu(changed).scenario.report_tree().index["team-b"]
    t_base, t_moved = np.array(base.timeline.t), np.array(moved.timeline.t)
    before = t_base < 20 * MINUTE
    assert np.array_equal(t_moved[: before.sum()], t_base[before])
    for i in np.flatnonzero(before):
        assert np.array_equal(moved.timeline.entitled[i], base.timeline.entitled[i])
    after = int(np.searchsorted(t_moved, 20 * MINUTE))
    assert moved.timeline.entitled[after][b] > base.timeline.entitled[after][b]
    # b's requeued jobs now go before a's waiting work when capacity frees at 40 minutes
    assert moved.queues["team-b"]["wait_p95_s"] < base.queues["team-b"]["wait_p95_s"]
    # --queues holds for the whole replay: the trace's own queue changes give way to it
    qfile = tmp_path / "q.yaml"
    qfile.write_text(json.dumps({"queues": [queue_doc(q) for q in read_fairgpu(path).scenario.queues]}))
    what_if = plan(read_fairgpu(changed), load_profile("fairgpu"), [], qfile)[1].scenario
    assert what_if.changes == [] and [q.weight for q in what_if.queues] == [3.0, 1.0, 1.0]


def test_a_deleted_queue_leaves_its_running_work_and_holds_its_waiting_work(tmp_path):
    """team-a deleted from 16 to 50 minutes: its running gang runs on (charged to nobody) and ends on time,
    its eval gang (submitted at 20) waits for the queue and starts after 50; the replay does the same."""
    sc = parity_scenario()
    without_a = [q for q in sc.queues if q.name != "team-a"]
    sc.changes = [Change(16 * MINUTE, queues=without_a), Change(50 * MINUTE, queues=sc.queues)]
    res, again = round_trip(sc, tmp_path / "t.jsonl")
    got = rows(res)
    assert got["a/group:train"] == (1 * MINUTE, 0, "finished")
    assert got["a/group:eval"][0] >= 50 * MINUTE
    base = rows(Simulation(parity_scenario(), load_profile("fairgpu")).run())
    assert base["a/group:eval"][0] < 50 * MINUTE  # without the deletion it starts earlier
    assert rows(again) == got
    for q, v in res.queues.items():
        assert again.queues[q]["gpu_hours"] == pytest.approx(v["gpu_hours"], rel=1e-9)
    # What the cluster did: a's pods ran 4 GPUs x 50 min, 4 x 20 and 2 x 1 x 30, its train gang once (its
    # run did not stop while its queue was away); the replay charges the 34 minutes in between to nobody.
    assert recorded(read_fairgpu(tmp_path / "t.jsonl"), res.horizon_s).queues["team-a"]["gpu_hours"] == (
        pytest.approx(340 / 60)
    )
    assert res.queues["team-a"]["gpu_hours"] == pytest.approx((340 - 4 * 34) / 60)


def test_an_eviction_the_cluster_refused_is_refused_in_the_replay(tmp_path):
    """b/b-5's eviction refused once (a PodDisruptionBudget): c's gang takes another of b's jobs instead.
    The trace says so (a `refused` record) and the replay refuses it too."""
    sc = parity_scenario()
    plain = Simulation(sc, load_profile("fairgpu")).run()
    assert "b/b-5" in {name for _, name, _ in plain.eviction_log}
    sc.refusals = {"b/b-5": [600.0]}
    res, again = round_trip(sc, tmp_path / "t.jsonl")
    assert "b/b-5" not in {name for _, name, _ in res.eviction_log}
    assert res.evictions == plain.evictions  # another victim in its place
    refused = records(tmp_path / "t.jsonl", "refused")
    assert [(r["workload"], r["retry"] - r["t"]) for r in refused] == [("b/b-5", 600.0)]
    assert rows(again) == rows(res)
    assert {n for _, n, _ in again.eviction_log} == {n for _, n, _ in res.eviction_log}


def test_a_refusal_with_no_eviction_to_refuse_is_one_line_naming_it(tmp_path):
    path = tmp_path / "t.jsonl"
    record(parity_scenario(), path)
    lines = path.read_text().splitlines()
    lines.append(json.dumps({"kind": "refused", "t": 1e6, "workload": "a/group:train", "retry": 1e6}))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf":{len(lines)}: workload: 'a/group:train' has no eviction under way"):
        read_fairgpu(path)


def test_a_new_engine_for_changed_queues_keeps_what_the_old_one_learned():
    """Decayed usage and learned run times move over by queue name (a weight change does not forget who used
    what); a queue created anew starts with none."""
    sc = parity_scenario()
    halved = [replace(q, usage_half_life=3600.0) for q in sc.queues]
    old = Scheduler(sc.nodes, QueueTree(halved), load_profile("fairgpu"))
    old.submit(replace(sc.workloads[0], queue="team-b", submit_time=0.0))
    old.cycle(0.0)
    for _ in range(MIN_SAMPLES):
        old.durations.finished(old.tree.index["team-a"], 600.0)
    heavier = [replace(q, weight=3.0) if q.name == "team-b" else q for q in halved]
    new = successor(old, sc.nodes, QueueTree([*heavier, QueueSpec("team-d", usage_half_life=3600.0)]), 1800.0)
    old.refresh_shares(1800.0)
    new.refresh_shares(1800.0)
    b, a, d = (new.tree.index[n] for n in ("team-b", "team-a", "team-d"))
    assert old.view.history_dom[old.tree.index["team-b"]] > 0
    assert new.view.history_dom[b] == pytest.approx(old.view.history_dom[old.tree.index["team-b"]])
    assert new.view.history_dom[d] == 0
    assert new.durations.learned(a) == old.durations.learned(old.tree.index["team-a"]) == 750.0
    assert new.durations.learned(b) is None
