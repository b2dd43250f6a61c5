"""Fast tests for what mutation testing of the live-safety modules (k8s/heartbeat.py, replica.py, leader.py)
found unchecked by the slower live tests: each fails on a one-line change that the suite let through
(`git show a748550:docs/testing.md`, session 9)."""

from __future__ import annotations

import asyncio
import math
import types

import pytest

from fairgpu.errors import InputError
from fairgpu.k8s import heartbeat as heartbeat_module
from fairgpu.k8s.heartbeat import Heartbeat
from test_handover_rules import writes_at


def test_a_loop_is_hung_only_after_five_seconds_without_a_pass_and_never_before_its_first(monkeypatch):
    """The default bound (`--heartbeat-timeout`, 5 s): a loop last seen exactly 5 s ago is still alive (the
    elector keeps the lease, /healthz is ok), one seen 5.5 s ago is hung; before its first pass (the caches
    still listing) it is neither: the elector does not take the lease, /healthz does not restart it."""
    now = [100.0]
    monkeypatch.setattr(heartbeat_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    beat = Heartbeat()
    assert (beat.age(), beat.fresh(), beat.stale()) == (None, False, False)
    beat.beat()
    now[0] = 105.0
    assert (beat.age(), beat.fresh(), beat.stale()) == (5.0, True, False)
    now[0] = 105.5
    assert (beat.fresh(), beat.stale()) == (False, True)
    beat.beat()
    assert (beat.age(), beat.fresh(), beat.stale()) == (0.0, True, False)


@pytest.mark.parametrize("stale_after, every", [(1.2, 0.5), (5.0, 0.0), (float("inf"), 1.0)])
def test_a_heartbeat_bound_is_refused_below_three_idle_passes_of_any_length_or_without_passes(stale_after, every):
    with pytest.raises(InputError, match="--heartbeat-timeout"):
        Heartbeat(stale_after, every)
    assert Heartbeat(1.5, 0.5).stale_after == 1.5  # exactly three passes: accepted


# -- k8s/replica.py: a graceful stop -------------------------------------------------------------------------------


class _Controller:
    """What stop_gracefully uses of a Controller, recording the order of the steps."""

    def __init__(self, steps: list[str], writes, drains: bool) -> None:
        self.steps, self.writes, self.drains, self.port = steps, writes, drains, "port"

    def stop_binding(self) -> None:
        self.steps.append("fence")

    async def drained(self, timeout: float) -> bool:
        self.steps.append("drain")
        return self.drains


class _Elector:
    lease_duration = 15.0

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps

    async def release(self, port: str) -> bool:
        self.steps.append(f"release on {port}")
        return True


def _stop(sending: int, unanswered_ago: float, drains: bool) -> tuple[bool, list[str]]:
    from fairgpu.k8s.replica import stop_gracefully

    steps: list[str] = []

    async def go() -> bool:
        async def running(name: str) -> None:
            try:
                await asyncio.sleep(60)
            finally:
                steps.append(f"{name} stopped")

        tasks = [asyncio.create_task(running("controller")), asyncio.create_task(running("elector"))]
        await asyncio.sleep(0)
        controller = _Controller(steps, writes_at(sending, unanswered_ago), drains)
        return await stop_gracefully(controller, _Elector(steps), tasks)  # type: ignore[arg-type]

    return asyncio.run(asyncio.wait_for(go(), 10)), steps


def test_a_stop_releases_the_lease_only_after_fence_drain_and_stop_and_never_with_a_binding_that_may_land():
    """Released: after the fence, the drain and both tasks' end, in that order. Not released when a Binding
    was given up 1 s ago (it may still land within the 15 s lease), nor when one is still on the wire."""
    assert _stop(0, math.inf, True) == (
        True,
        ["fence", "drain", "controller stopped", "elector stopped", "release on port"],
    )
    assert _stop(0, 20.0, True)[0] is True  # given up longer than a lease duration ago: it cannot land now
    assert _stop(0, 1.0, True) == (False, ["fence", "drain", "controller stopped", "elector stopped"])
    assert _stop(1, math.inf, False)[0] is False


# -- k8s/leader.py: the heartbeat's hold on the lease, and release_lease --------------------------------------------


def test_a_stale_scheduling_loop_is_reported_once_per_spell_and_its_elector_neither_takes_nor_keeps_the_lease(
    monkeypatch, caplog
):
    """Before the first pass: no lease, and nothing reported (the caches are listing). Hung: no lease, one
    error per spell, however often the elector looks; alive again: the lease may be taken; hung again: a new
    error."""
    from fairgpu.k8s.leader import LeaderElector

    now = [100.0]
    monkeypatch.setattr(heartbeat_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    beat = Heartbeat()
    elector = LeaderElector(None, "ns", "fairgpu", "r1", heartbeat=beat)  # type: ignore[arg-type]

    def looks(n: int) -> list[bool]:
        return [elector._scheduler_alive() for _ in range(n)]

    errors = lambda: [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]  # noqa: E731
    assert looks(2) == [False, False] and errors() == []
    beat.beat()
    assert looks(2) == [True, True] and errors() == []
    now[0] = 106.0
    assert looks(3) == [False] * 3
    assert errors() == ["r1: the scheduling loop has not passed for 6.0s (bound 5s): not renewing the lease"]
    beat.beat()
    assert looks(1) == [True]
    now[0] = 113.0
    assert looks(2) == [False, False] and len(errors()) == 2 and "7.0s" in errors()[1]
    # an elector whose first look finds the loop already hung (started late, or a retry period long) says so
    late = LeaderElector(None, "ns", "fairgpu", "r2", heartbeat=beat)  # type: ignore[arg-type]
    assert late._scheduler_alive() is False and errors()[2].startswith("r2: the scheduling loop has not passed")


def test_a_released_lease_goes_to_a_standby_at_once_and_a_missing_one_is_not_released(fake_api, tmp_path):
    """release_lease: True, the record names no holder for one second with its transitions kept, and a standby
    (which saw it held a moment ago) takes it at its next attempt, counting one transition more. With no lease:
    False, nothing created."""
    from fairgpu.errors import KubeError
    from fairgpu.k8s.client import KubeClient
    from fairgpu.k8s.leader import LeaderElector, release_lease
    from fairgpu.k8s.port import LEASES

    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> tuple[bool, dict, bool, dict, bool, str]:
        port = await KubeClient.connect(kubeconfig)
        try:
            r1, r2 = (LeaderElector(port, "fairgpu-system", "fairgpu", who) for who in ("r1", "r2"))
            assert await r1.try_acquire_or_renew() and await r1.try_acquire_or_renew()
            assert not await r2.try_acquire_or_renew()  # held: the standby waits
            released = await release_lease(port, "fairgpu-system", "fairgpu", "r1")
            record = await port.get(LEASES, "fairgpu", "fairgpu-system")
            taken = await r2.try_acquire_or_renew()
            after = await port.get(LEASES, "fairgpu", "fairgpu-system")
            await port.delete(LEASES, "fairgpu", "fairgpu-system")
            missing = await release_lease(port, "fairgpu-system", "fairgpu", "r2")
            try:
                await port.get(LEASES, "fairgpu", "fairgpu-system")
                gone = "created"
            except KubeError as err:
                gone = str(err.code)
        finally:
            await port.close()
        return released, record["spec"], taken, after["spec"], missing, gone

    released, record, taken, after, missing, gone = asyncio.run(asyncio.wait_for(go(), 20))
    assert released is True
    assert (record["holderIdentity"], record["leaseDurationSeconds"], record["leaseTransitions"]) == ("", 1, 0)
    assert taken is True and (after["holderIdentity"], after["leaseTransitions"]) == ("r2", 1)
    assert (missing, gone) == (False, "404")


def test_the_election_accepts_exactly_the_timings_client_go_accepts():
    """client-go's rule: leaseDuration > renewDeadline > JitterFactor (1.2) × retryPeriod > 0; a setting
    valid there (renew 2 s, retry 1.6 s: 2 > 1.92) is valid here, one just past it (retry 1.7 s) is not."""
    from fairgpu.k8s.leader import renew_deadline_of

    assert renew_deadline_of(3.0, 2.0, 1.6) == 2.0 and renew_deadline_of(3.0, None, 1.6) == 2.0
    for lease, renew, retry in ((3.0, 2.0, 1.7), (2.0, 2.0, 0.5), (3.0, 2.0, 0.0)):
        with pytest.raises(ValueError, match="leader election needs"):
            renew_deadline_of(lease, renew, retry)
