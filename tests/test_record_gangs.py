"""Session 13 (safe10): `fairgpu record` forms workloads as the controller does (k8s/workloads.by_workload), so a
twin replay of a pod group that several users' pods joined charges each user's gang to that user."""

from __future__ import annotations

from chaos import chaos_node, chaos_pod
from fairgpu.k8s.recording import Watcher
from fairgpu.twin.recorder import Seen
from fairgpu.twin.writer import TraceWriter
from live_setup import ONE


class Capture:
    def __init__(self) -> None:
        self.seen: list[Seen] = []

    def observe(self, now: float, seen: Seen) -> None:
        self.seen.append(seen)


def test_the_recorder_makes_each_users_members_of_a_pod_group_a_gang_of_their_own(tmp_path):
    """bob's g-0 and g-1 and alice's z (created between them) carry group g, two members each. The controller runs
    bob's gang without z, then alice's once z2 exists (test_live_forged::test_a_pod_cannot_join_another_users_gang_…).
    Before: the recorder made one gang of all three, pending and then running, charged to bob."""
    watcher = Watcher(None, TraceWriter(tmp_path / "trace"))  # type: ignore[arg-type]  # caches filled by hand
    capture = Capture()
    watcher.recorder = capture  # type: ignore[assignment]
    watcher.nodes.cache["node-000"] = chaos_node(0, 4)
    watcher.queues.cache["q-a"] = {"metadata": {"name": "q-a"}, "spec": {"namespaces": ["a"]}}

    def add(user: str, name: str, second: int, node: str = "") -> None:
        p = chaos_pod(
            "a", name, ONE, {"fairgpu.io/pod-group": "g", "fairgpu.io/min-members": "2", "fairgpu.io/user": user}
        )
        p["metadata"] |= {
            "annotations": {"fairgpu.io/user-name": user},
            "creationTimestamp": f"2026-12-02T10:00:0{second}Z",
        }
        if node:
            p["spec"]["nodeName"] = node
            p["status"] = {"phase": "Running"}
        watcher.pods.cache[f"a/{name}"] = p

    def gangs(seen: Seen) -> list[tuple[str, str, tuple[str, ...]]]:
        return sorted((n, seen.workload(n).user, seen.workload(n).pod_names) for n in [*seen.pending, *seen.running])

    add("bob", "g-0", 0)
    add("alice", "z", 1)
    add("bob", "g-1", 2)
    watcher.observe(1.0)
    assert gangs(capture.seen[-1]) == [("a/group:g", "bob", ("a/g-0", "a/g-1"))]  # z alone is not a whole gang
    add("bob", "g-0", 0, "node-000")
    add("bob", "g-1", 2, "node-000")
    add("alice", "z2", 3)
    watcher.observe(2.0)
    seen = capture.seen[-1]
    assert gangs(seen) == [("a/group:g", "bob", ("a/g-0", "a/g-1")), ("a/group:g/z", "alice", ("a/z", "a/z2"))]
    assert list(seen.running) == ["a/group:g"] and list(seen.pending) == ["a/group:g/z"]
