"""Acceptance figures of the foundation issue on the built-in scenarios: kube-default lets one tenant
monopolise the cluster (by priority, or by submitting more); fairgpu shares it fairly without losing
utilization. Each (scenario, profile) run takes seconds, so each runs once per session (conftest.simulated)."""

from __future__ import annotations

import pytest

from conftest import simulated
from fairgpu.sim.scenario import builtin_scenarios

MONOPOLIES = ["priority-monopoly", "batch-monopoly"]


@pytest.fixture(scope="module")
def results():
    return simulated


@pytest.mark.parametrize("scenario", MONOPOLIES)
def test_kube_default_lets_team_a_monopolise(results, scenario: str) -> None:
    res = results(scenario, "kube-default")
    a = res.queues["team-a"]
    for other in ("team-b", "team-c"):
        assert res.queues[other]["backlogged_s"] > 0.5 * res.horizon_s, other
    assert a["share_while_others_wait"] is not None
    assert a["share_while_others_wait"] >= 0.80
    assert a["gpu_hours"] > 2 * res.queues["team-b"]["gpu_hours"]


@pytest.mark.parametrize("scenario", MONOPOLIES)
def test_fairgpu_shares_fairly(results, scenario: str) -> None:
    res = results(scenario, "fairgpu")
    assert res.fairness_error <= 0.05
    assert res.jain_index is not None
    assert res.jain_index >= 0.95
    # Three equal-weight, always-backlogged teams: none holds much more than its third.
    for name, q in res.queues.items():
        assert q["share_while_others_wait"] is not None
        assert q["share_while_others_wait"] <= 0.40, name


@pytest.mark.parametrize("scenario", MONOPOLIES)
def test_fairgpu_keeps_utilization(results, scenario: str) -> None:
    fair, kube = results(scenario, "fairgpu"), results(scenario, "kube-default")
    assert fair.utilization >= kube.utilization - 0.02


@pytest.mark.parametrize("scenario", MONOPOLIES)
def test_kube_default_is_measurably_unfair(results, scenario: str) -> None:
    # The fairness figures must tell the two profiles apart, or the fairgpu bounds above prove nothing.
    res = results(scenario, "kube-default")
    assert res.fairness_error > 0.3
    assert res.jain_index is not None
    assert res.jain_index < 0.6


def test_demo_fairgpu_is_fairer_than_kube_default(results) -> None:
    fair, kube = results("demo", "fairgpu"), results("demo", "kube-default")
    assert fair.fairness_error < kube.fairness_error


# Floors recorded from this engine's seeded (deterministic) runs, with 0.002 of slack for float noise: a
# change that makes a scenario less fair, or less busy than kube-default less one point, fails here.
# demo and priority-monopoly miss an error of 0.02 and a Jain of 0.99 only over their first half hour,
# while jobs started before the other teams arrived drain (their queues do not preempt for fair share).
# fair-share-preemption and non-preemptive lost 1.4 and 0.4 points of utilization to a GPU left idle when a
# starving workload took over another's due hold (framework/starving.py take_over).
FLOORS = {  # scenario: (fairness error at most, Jain index at least)
    "demo": (0.0282, 0.9650),
    "priority-monopoly": (0.0060, 0.9877),
    "batch-monopoly": (0.0147, 0.9927),
    "fair-share-preemption": (0.0019, 0.9981),
    "non-preemptive": (0.0251, 0.9685),
}


@pytest.mark.parametrize("scenario", FLOORS)
def test_fairgpu_is_no_less_fair_and_within_a_point_of_kube_defaults_utilization(results, scenario: str) -> None:
    fair, kube = results(scenario, "fairgpu"), results(scenario, "kube-default")
    error, jain = FLOORS[scenario]
    assert fair.fairness_error <= error + 0.002
    assert fair.jain_index is not None and fair.jain_index >= jain - 0.002
    assert fair.utilization >= kube.utilization - 0.01


# The other built-in scenarios, recorded the same way (their utilization is not held to kube-default's: a
# static partition, MIG slices and gangs that wait for whole nodes leave GPUs idle by design).
OTHER_FLOORS = {
    "decayed-usage": (0.0466, 0.8165),
    "elastic": (0.0052, None),
    "gang-starvation": (0.0381, 0.5),
    "gang-victims": (0.1088, 0.8776),
    "hierarchy": (0.0086, 0.9936),
    "mig-numa": (0.1261, 0.9679),
    "priority-within-queue": (0.0, 1.0),
    "reclaim": (0.0911, 0.7944),
    "static-partition": (0.0, 1.0),
    "users-in-queue": (0.0, None),
}


def test_every_built_in_scenario_has_a_fairness_floor() -> None:
    assert sorted({*FLOORS, *OTHER_FLOORS}) == sorted(builtin_scenarios())


@pytest.mark.parametrize("scenario", OTHER_FLOORS)
def test_no_other_built_in_scenario_gets_less_fair(results, scenario: str) -> None:
    fair = results(scenario, "fairgpu")
    error, jain = OTHER_FLOORS[scenario]
    assert fair.fairness_error <= error + 0.002
    assert (fair.jain_index is None) == (jain is None)
    assert jain is None or fair.jain_index >= jain - 0.002
