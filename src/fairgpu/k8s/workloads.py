"""From pods to engine workloads: which queue serves a pod, how waiting pods form workloads (a pod group as
one gang, members beyond its minimum elastic), and the one place a Workload is built from pods."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fairgpu.errors import RequestError
from fairgpu.framework.scheduler import Scheduler
from fairgpu.k8s.queues import QueueMap
from fairgpu.k8s.translate import PodInfo
from fairgpu.model import Workload

GANG_ADMITTED = "fairgpu.io/gang-admitted"  # on every member once a gang starts binding


@dataclass(slots=True)
class Batch:
    """Waiting pods that go to the engine together, under one workload name."""

    name: str
    members: list[PodInfo]
    min_pods: int | None = None  # fewer than all: the rest are elastic


def queue_for(p: PodInfo, queues: QueueMap) -> tuple[str | None, str]:
    """The queue a pod belongs to (its label, else the queue serving its namespace), or None and why not."""
    if p.queue_label is not None:
        allowed = queues.allowed.get(p.queue_label)
        if allowed is None:
            return None, f"queue {p.queue_label!r} does not exist"
        if allowed and p.namespace not in allowed:
            return None, f"namespace {p.namespace} may not use queue {p.queue_label!r}"
        return p.queue_label, ""
    served = queues.serving.get(p.namespace)
    if served is not None:
        return served, ""
    return None, f"no queue serves namespace {p.namespace}; label the pod fairgpu.io/queue"


def workload_of(name: str, queue: str, members: list[PodInfo], min_pods: int | None = None) -> Workload:
    """The engine's view of these pods as one workload (submitted waiting, or adopted running)."""
    first = members[0]
    return Workload(
        name=name,
        queue=queue,
        pods=tuple(m.spec for m in members),
        submit_time=min(m.created for m in members),
        priority=max(m.priority for m in members),
        duration=first.duration,
        user=first.user,
        pod_names=tuple(m.key for m in members),
        min_pods=min_pods,
    )


def by_workload(pods: Iterable[PodInfo]) -> dict[tuple[str, str], list[PodInfo]]:
    """Our pods as the workloads they form, keyed (name, user): a lone pod on its own, each user's members of a pod
    group together. A gang is one workload of one user: any pod of the namespace may carry a group's label, and
    joining another user's gang charged the joiner's GPUs to that user (the controller and the recorder alike)."""
    out: dict[tuple[str, str], list[PodInfo]] = {}
    for p in pods:
        out.setdefault((f"{p.namespace}/group:{p.group}" if p.group else p.key, p.user), []).append(p)
    return out


def pending_batches(
    keys: set[str],
    pods: dict[str, PodInfo],
    groups: dict[tuple[str, str], set[str]],
    waiting: Callable[[PodInfo], bool],
    taken: Callable[[str], bool],
    unschedulable: Callable[[PodInfo, str], None],
) -> list[Batch]:
    """The workloads to submit for the waiting pods among `keys`: a lone pod on its own, a group's waiting
    members as one gang once enough of them exist. `taken(name)`: a workload of that name exists already."""
    out: list[Batch] = []
    touched: dict[tuple[str, str], list[PodInfo]] = {}
    for key in keys:
        p = pods.get(key)
        if p is None:
            continue
        if p.group:
            touched.setdefault((p.namespace, p.group), [])
        elif waiting(p):
            out.append(Batch(key, [p]))
    named: set[str] = set()
    for ns, group in touched:
        grouped = by_workload(pods[k] for k in groups.get((ns, group), ()) if k in pods)
        for _, everyone in sorted(grouped.items()):
            out += _gang(ns, group, everyone, waiting, lambda name: taken(name) or name in named, unschedulable)
            named.update(b.name for b in out)
    return out


def _gang(
    ns: str,
    group: str,
    everyone: list[PodInfo],
    waiting: Callable[[PodInfo], bool],
    taken: Callable[[str], bool],
    unschedulable: Callable[[PodInfo, str], None],
) -> list[Batch]:
    """The batch of one user's waiting members of a pod group, if enough of them exist."""
    members = [m for m in everyone if waiting(m)]
    if not members:
        return []
    bound = sum(1 for m in everyone if m.node)
    admitted = any(m.annotations.get(GANG_ADMITTED) == "true" for m in members)
    # Once admitted, members that ran and are gone no longer count against the minimum, but the ones
    # still waiting go together: never one by one.
    need = max(m.min_members for m in members) - bound
    if admitted:
        need = min(len(members), need)
    if len(members) < need:
        for m in members:
            unschedulable(m, f"gang {group}: {len(members) + bound} of {need + bound} members exist")
        return []
    members.sort(key=lambda m: m.name)
    # Members beyond what the gang still needs are elastic: they run as room allows and are the first
    # given back when another queue reclaims. Members that join a running group form a workload of
    # their own, named after their first member.
    least = max(1, need)
    name = f"{ns}/group:{group}"
    if taken(name):
        name = f"{name}/{members[0].name}"
    return [Batch(name, members, least if len(members) > least else None)]


def submit(engine: Scheduler, batch: Batch, queues: QueueMap) -> str | None:
    """Queue a batch in the engine as one workload; why it cannot be queued, or None."""
    queue, why = queue_for(batch.members[0], queues)
    if queue is None:
        return why
    try:
        engine.submit(workload_of(batch.name, queue, batch.members, batch.min_pods))
    except RequestError as err:
        return str(err)
    return None
