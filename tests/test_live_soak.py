"""The chaos soak, short: a few hundred pods against two replicas and an unreliable API server, audited
from the fake's own history (tests/chaos.py). The long one is bench/soak.py."""

from __future__ import annotations

import asyncio

from chaos import Chaos, run_chaos


def test_short_chaos_soak_has_no_violations(fake_api, tmp_path):
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))
    report = asyncio.run(run_chaos(fake_api, kubeconfig, Chaos(seed=7, pods=300, arrival_s=15.0, limit_s=60.0)))
    assert report["violations"] == dict.fromkeys(report["violations"], 0), report
    assert report["finished"], report
    faults = report["faults"]
    assert faults["leader_kills"] >= 1 and faults["node_deletions"] >= 1, faults
    assert faults.get("after 0", 0) + faults.get("after 500", 0) > 0, faults  # answers were lost
    assert report["binds"] >= 250, report
