"""Reporter._condition on its own: the PodScheduled=False condition it writes carries the pod's other conditions
as last seen and that version as a precondition (a merge patch replaces the whole list: one landing after the
kubelet marked the pod Ready must be refused, never wipe it), writes nothing for a pod seen bound, and nothing
once a newer reason superseded it (the live test is test_live_flaky.py's Ready condition)."""

from __future__ import annotations

import asyncio

from fairgpu.k8s.port import PODS
from fairgpu.k8s.reporter import Reporter

KEY, MESSAGE = "a/p", "0/2 nodes have a free GPU"
CONDITION = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": MESSAGE}


class Port:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict, str, str]] = []

    async def patch(self, kind: object, name: str, body: dict, ns: str, subresource: str) -> dict:
        assert kind is PODS
        self.patches.append((name, body, ns, subresource))
        return {}


def written(cached: dict | None, last: str = MESSAGE) -> list[dict]:
    """The bodies Reporter._condition patched the pod's status with, the pod cached as `cached`."""
    port = Port()
    reporter = Reporter(port, "fairgpu", pod_cache=lambda key: cached if key == KEY else None)  # type: ignore[arg-type]
    reporter.last[KEY] = last
    asyncio.run(reporter._condition(KEY, MESSAGE, CONDITION))
    assert all(p[0] == "p" and p[2] == "a" and p[3] == "status" for p in port.patches)
    return [p[1] for p in port.patches]


def pod(node: str | None, rv: str | None, conditions: list[dict] | None) -> dict:
    return {"metadata": {"resourceVersion": rv}, "spec": {"nodeName": node}, "status": {"conditions": conditions}}


def test_the_condition_keeps_the_pods_other_conditions_and_its_version_as_precondition():
    """Seen unbound at version 7 with Initialized and an older PodScheduled: the list written is Initialized and
    the new PodScheduled, under resourceVersion 7. Catches the version check or the kept list emptied (`and` for
    `or` in reading status or conditions, `is` for `is not`), the old PodScheduled kept instead of the others."""
    old = {"type": "PodScheduled", "status": "False", "message": "earlier"}
    init = {"type": "Initialized", "status": "True"}
    body = {"status": {"conditions": [init, CONDITION]}, "metadata": {"resourceVersion": "7"}}
    assert written(pod(None, "7", [old, init])) == [body]
    # no conditions yet: just the new one, still under the version
    assert written(pod(None, "7", None)) == [
        {"status": {"conditions": [CONDITION]}, "metadata": {"resourceVersion": "7"}}
    ]
    # not cached (or no version known): the condition alone, unconditionally
    assert written(None) == written(pod(None, None, [init])) == [{"status": {"conditions": [CONDITION]}}]


def test_no_condition_for_a_pod_seen_bound_or_a_reason_superseded():
    """Bound meanwhile (PodScheduled is the Binding's now), or a newer reason posted: nothing is written. Catches
    the bound check dropped or inverted (`is` / `or` / `and`) and the supersession check inverted."""
    assert written(pod("node-01", "9", [{"type": "Ready", "status": "True"}])) == []
    assert written(pod(None, "7", None), last="a newer reason") == []
