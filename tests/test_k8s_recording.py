"""`fairgpu record`'s Watcher forms workloads from its caches as the controller does (k8s/recording.py),
without an API server: the pods the controller leaves alone are left out of the recording too."""

from __future__ import annotations

from pathlib import Path

from fairgpu.k8s.recording import Watcher
from fairgpu.twin.recorder import Seen
from fairgpu.twin.writer import TraceWriter


def _pod(name: str, phase: str = "Pending", gated: bool = False, gpumem: str | None = None) -> dict:
    limits = {"nvidia.com/gpu": "1", **({"nvidia.com/gpumem": gpumem} if gpumem else {})}
    spec: dict = {"schedulerName": "fairgpu", "containers": [{"name": "m", "resources": {"limits": limits}}]}
    if gated:
        spec["schedulingGates"] = [{"name": "example.com/quota"}]
    meta = {"name": name, "namespace": "ns", "uid": f"u-{name}", "labels": {"fairgpu.io/queue": "q"}}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_the_recording_leaves_out_gated_finished_and_unschedulable_pods_as_the_controller_does(tmp_path: Path):
    """Of four pending-looking pods only `plain` is a workload the controller would queue: `gated` waits for its
    scheduling gates, `done` has finished, `bad` asks for GPU memory in a unit HAMi does not read (its problem)."""
    watcher = Watcher(None, TraceWriter(tmp_path / "trace.jsonl"))  # type: ignore[arg-type]
    watcher.queues.cache["/q"] = {"metadata": {"name": "q", "uid": "q"}, "spec": {}}
    pods = [_pod("plain"), _pod("gated", gated=True), _pod("done", phase="Succeeded"), _pod("bad", gpumem="10Gi")]
    watcher.pods.cache.update({f"ns/{p['metadata']['name']}": p for p in pods})
    seen: list[Seen] = []
    watcher.recorder.observe = lambda now, s: seen.append(s)  # type: ignore[method-assign]
    watcher.observe(0.0)
    assert (seen[0].pending, seen[0].running) == (["ns/plain"], [])
