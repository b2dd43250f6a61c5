"""`simulate --workloads FILE`: one row per workload and profile, as CSV or JSON, for a spreadsheet or
a notebook."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from fairgpu.sim.runner import SimResult

COLUMNS = (
    "profile", "workload", "queue", "user", "pods", "submitted_s", "first_start_s", "wait_s", "evictions", "state",
)  # fmt: skip


def write_workloads(path: Path, results: list[SimResult]) -> None:
    rows = [{"profile": res.profile, **row} for res in results for row in res.workloads]
    if path.suffix == ".json":
        path.write_text(json.dumps({"workloads": rows}) + "\n")
        return
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
