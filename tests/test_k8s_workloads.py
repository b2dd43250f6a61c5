"""How waiting pods become engine workloads (k8s/workloads.pending_batches): a pod group is a gang of one
user's pods, it waits until enough members exist, and its members beyond the minimum are elastic. Pure
functions over parsed pods: no API server."""

from __future__ import annotations

from fairgpu.k8s.translate import MIN_MEMBERS, POD_GROUP, USER_LABEL, PodInfo, pod_info
from fairgpu.k8s.workloads import GANG_ADMITTED, Batch, pending_batches


def _pod(name: str, user: str, group: str, size: int, node: str | None = None, admitted: bool = False) -> PodInfo:
    meta = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "labels": {USER_LABEL: user, POD_GROUP: group, MIN_MEMBERS: str(size)},
        "annotations": {GANG_ADMITTED: "true"} if admitted else {},
    }
    limits = {"nvidia.com/gpu": "1"}
    spec = {"schedulerName": "fairgpu", "containers": [{"name": "m", "resources": {"limits": limits}}]}
    if node is not None:
        spec["nodeName"] = node
    return pod_info({"metadata": meta, "spec": spec, "status": {"phase": "Running" if node else "Pending"}})


def _batches(pods: list[PodInfo], taken: tuple[str, ...] = ()) -> tuple[list[Batch], dict[str, str]]:
    """The batches of these pods (every one touched), and what each pod refused was told."""
    by_key = {p.key: p for p in pods}
    groups: dict[tuple[str, str], set[str]] = {}
    for p in pods:
        assert p.group is not None
        groups.setdefault((p.namespace, p.group), set()).add(p.key)
    told: dict[str, str] = {}
    out = pending_batches(
        set(by_key),
        by_key,
        groups,
        lambda p: p.node is None,
        lambda name: name in taken,
        lambda p, why: told.__setitem__(p.name, why),
    )
    return out, told


def test_each_users_pods_of_a_group_are_a_gang_of_their_own_with_its_own_name():
    """alice's three and bob's two pods carry one group label (size 2): two gangs, each of one user's pods,
    under two names (one workload name twice would merge or lose one). alice's is named after the group, bob's
    after its first member; alice's third pod is elastic."""
    pods = [_pod(f"a{i}", "alice", "g", 2) for i in (2, 0, 1)] + [_pod(f"b{i}", "bob", "g", 2) for i in (1, 0)]
    out, told = _batches(pods)
    assert not told
    got = {b.name: ([m.name for m in b.members], {m.user for m in b.members}, b.min_pods) for b in out}
    assert got == {
        "ns/group:g": (["a0", "a1", "a2"], {"alice"}, 2),
        "ns/group:g/b0": (["b0", "b1"], {"bob"}, None),
    }


def test_a_gang_with_exactly_its_minimum_runs_whole_and_one_short_waits_naming_the_count():
    """bob's pods do not make up alice's gang: alice has 2 of 3, and is told so; with a third she goes as one
    gang of exactly three (no elastic member)."""
    pods = [_pod("a0", "alice", "g", 3), _pod("a1", "alice", "g", 3), _pod("b0", "bob", "g", 1)]
    out, told = _batches(pods)
    assert [b.name for b in out] == ["ns/group:g"]  # alice's waiting gang names no workload yet
    assert told == {"a0": "gang g: 2 of 3 members exist", "a1": "gang g: 2 of 3 members exist"}
    out, told = _batches([*pods, _pod("a2", "alice", "g", 3)])
    assert not told
    alice = next(b for b in out if b.members[0].user == "alice")
    assert ([m.name for m in alice.members], alice.min_pods) == (["a0", "a1", "a2"], None)


def test_members_already_running_count_towards_the_minimum_and_in_what_a_short_gang_is_told():
    """A group of 4 with 2 running: 2 waiting complete it; 1 waiting is told '3 of 4'."""
    running = [_pod("a0", "alice", "g", 4, node="n0"), _pod("a1", "alice", "g", 4, node="n1")]
    out, told = _batches([*running, _pod("a2", "alice", "g", 4), _pod("a3", "alice", "g", 4)])
    assert not told
    assert [([m.name for m in b.members], b.min_pods) for b in out] == [(["a2", "a3"], None)]
    out, told = _batches([*running, _pod("a2", "alice", "g", 4)])
    assert (out, told) == ([], {"a2": "gang g: 3 of 4 members exist"})


def test_members_joining_a_running_group_past_its_minimum_run_one_at_least_under_a_name_of_their_own():
    """Two of a group of 2 run (its name taken by them); three more join: elastic, one of them at least (a
    minimum of 0 pods is no workload), named after the first of them by name."""
    running = [_pod("a0", "alice", "g", 2, node="n0"), _pod("a1", "alice", "g", 2, node="n1")]
    joining = [_pod(n, "alice", "g", 2) for n in ("a4", "a2", "a3")]
    out, told = _batches([*running, *joining], taken=("ns/group:g",))
    assert not told
    assert [(b.name, [m.name for m in b.members], b.min_pods) for b in out] == [
        ("ns/group:g/a2", ["a2", "a3", "a4"], 1)
    ]


def test_an_admitted_gang_whose_members_ran_and_left_goes_with_the_ones_still_waiting_and_a_new_one_waits():
    """A gang of 3 was admitted (it started binding); one member ran and is gone: the two still waiting go
    together. Two waiting members of a gang never admitted still wait for a third."""
    out, told = _batches([_pod("a1", "alice", "g", 3, admitted=True), _pod("a2", "alice", "g", 3, admitted=True)])
    assert not told
    assert [([m.name for m in b.members], b.min_pods) for b in out] == [(["a1", "a2"], None)]
    out, told = _batches([_pod("a1", "alice", "g", 3), _pod("a2", "alice", "g", 3)])
    assert out == [] and set(told) == {"a1", "a2"}
