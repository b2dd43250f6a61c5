"""The hung leader's hand-over rules in k8s/leader.py, each on its own and fast (the live tests are
test_live_handover.py): the fence closes before a hand-over is due, the release waits for the loop's writes
and gives up once the lease would have expired, the elector wakes when the heartbeat goes stale, and a term
the loop has not heard of fences every write."""

from __future__ import annotations

import asyncio
import time

from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.heartbeat import Heartbeat
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.port import LEASES
from fairgpu.k8s.writes import Writes

NS = "fairgpu-system"


def writes_at(sending: int = 0, unanswered_ago: float = float("inf")) -> Writes:
    """The loop's writes (k8s/writes.py) with `sending` on the wire, the last given up `unanswered_ago` s ago."""
    writes = Writes()
    writes._sending.value = sending
    writes._unanswered_at.value = time.monotonic() - unanswered_ago
    return writes


def test_the_hand_over_releases_only_while_no_write_may_land_and_only_before_the_lease_would_expire(fake_api, tmp_path):
    """r1 holds the lease and its hand-over is due: with a write on the wire, or one given up 1 s ago (15 s
    lease), nothing is written and it stays due; with none, the lease is released (no holder) and it is done.
    Held again and due no longer (the lease would have expired by now): nothing is written, and it is done."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> list[tuple[str, bool]]:
        port = await KubeClient.connect(kubeconfig)
        seen = []
        try:
            cases = ((writes_at(1), 15.0), (writes_at(0, 1.0), 15.0), (writes_at(), 15.0), (writes_at(), -0.1))
            for writes, due in cases:
                e = LeaderElector(port, NS, "fairgpu", "r1", writes=writes)
                assert await e.try_acquire_or_renew()
                e._hand_over_by = time.monotonic() + due
                await e._hand_over(port)
                holder = (await port.get(LEASES, "fairgpu", NS))["spec"]["holderIdentity"]
                seen.append((holder, e._hand_over_by > 0))
        finally:
            await port.close()
        return seen

    assert asyncio.run(asyncio.wait_for(go(), 20)) == [("r1", True), ("r1", True), ("", False), ("r1", False)]


def test_a_stale_heartbeat_closes_the_fence_first_then_makes_the_hand_over_due_and_a_fresh_one_calls_it_off():
    """A leader whose heartbeat went stale: "not held" is published before anything else, and the hand-over is
    due for a lease duration from now (given the loop's writes; without them, never: the lease expires). A
    fresh heartbeat calls a due hand-over off."""

    async def go() -> list[object]:
        out: list[object] = []
        for writes in (Writes(), None):
            beat = Heartbeat(0.3, 0.09)
            beat._at.value = time.monotonic() - 1.0  # hung a second ago
            published: list[tuple[float, bool]] = []
            e = LeaderElector(None, NS, "fairgpu", "r1", 15.0, heartbeat=beat, writes=writes)  # type: ignore[arg-type]
            e.publish = lambda until, began, seen=published: seen.append((until, began))
            e._caller = asyncio.get_running_loop()
            e._valid_until = time.monotonic() + 5
            before = time.monotonic()
            assert not e._scheduler_alive()
            out += [published, e.remaining(), round(e._hand_over_by - before) if e._hand_over_by else 0]
            beat.beat()
            assert e._scheduler_alive()
            out.append(e._hand_over_by)
        return out

    assert asyncio.run(go()) == [[(0.0, False)], 0.0, 15, 0.0, [(0.0, False)], 0.0, 0, 0.0]


def test_a_leaders_elector_wakes_when_its_heartbeat_goes_stale_not_at_its_next_attempt():
    """Between two attempts (0.75 s apart) a leader whose last beat was 0.15 s ago (hung after 0.3 s) looks
    again when the heartbeat goes stale, 0.15 s in; one whose loop beats meanwhile sleeps the rest of the
    period, no longer; a standby's pause is the period."""

    async def pause(leading: bool, beat_at: float | None) -> float:
        beat = Heartbeat(0.3, 0.09)
        beat._at.value = time.monotonic() - 0.15
        e = LeaderElector(None, NS, "fairgpu", "r1", 1.5, 0.75, 1.0, heartbeat=beat)  # type: ignore[arg-type]
        e._valid_until = time.monotonic() + 10 if leading else 0.0
        if beat_at is not None:
            asyncio.get_running_loop().call_later(beat_at, beat.beat)
        started = time.monotonic()
        await e._pause()
        return time.monotonic() - started

    async def go() -> list[float]:
        return list(await asyncio.gather(pause(True, None), pause(True, 0.05), pause(False, None)))

    stale, beaten, standby = asyncio.run(go())
    assert 0.14 <= stale < 0.3, stale
    assert 0.7 <= beaten < 0.95, beaten
    assert 0.7 <= standby < 0.95, standby


def test_a_term_the_loop_has_not_heard_of_fences_every_write():
    """The elector's thread began a term (its deadline is ahead) that the scheduling loop has not been told of:
    `remaining()` is 0, so nothing passes the fence until the loop knows which term it acts in."""
    e = LeaderElector(None, NS, "fairgpu", "r1")  # type: ignore[arg-type]
    e._valid_until, e._begun = time.monotonic() + 10, 1
    unheard = e.remaining()
    e.term = 1
    assert unheard == 0.0 and 9 < e.remaining() <= 10
