"""Fast tests for what mutation testing of the live-safety modules (k8s/heartbeat.py, replica.py, leader.py)
found unchecked by the slower live tests: each fails on a one-line change that the suite let through
(docs/testing.md, session 9)."""

from __future__ import annotations

import types

import pytest

from fairgpu.errors import InputError
from fairgpu.k8s import heartbeat as heartbeat_module
from fairgpu.k8s.heartbeat import Heartbeat


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
