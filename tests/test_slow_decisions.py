"""bench/slow_decisions.py tags each real decision by what happened in it: the tags must follow the engine
(a renamed step would leave every decision untagged and the slowest 1 % all 'placed')."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_decisions_are_tagged_by_what_happened_in_them():
    cmd = [sys.executable, str(ROOT / "bench" / "slow_decisions.py"), "--nodes", "40", "--pods", "1500"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout)
    kinds = out["kinds"]
    assert sum(n for n, _, _ in kinds.values()) == out["decisions"]
    tags = {t for k in kinds for t in k.split(" + ")}
    # the cluster fills: gangs, new shapes, new weights and a refreshed mix, failures
    assert {"gang", "new shape", "rescore", "weights", "mix", "placed", "failed"} <= tags, tags
    # no queue of the benchmark has a guarantee, a fair-share or a priority policy: no failure sets up a
    # victim search that could find nobody (Preempt.may_find)
    assert "preemption" not in tags, tags
    slow = sum(n for n, _ in out["slowest_1pct"].values())
    assert 0 < slow <= out["decisions"] // 100 + 5  # the decisions at or above p99 (ties included)
    assert all(k in kinds and total == kinds[k][0] for k, (_, total) in out["slowest_1pct"].items())
