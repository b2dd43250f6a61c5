"""Queue custom resources (queues.fairgpu.io/v1alpha1, cluster-scoped) → QueueSpec.

The spec mirrors a scenario's queue keys and is validated by the same model, so a queue means the same in
the simulator and in the cluster. An invalid spec is reported (the caller sets a status condition) and the
queue is left out; it never stops the scheduler.

Several queues may list one namespace: a pod there labelled with any of them uses that queue, and unlabelled
pods go to the oldest claimant (creation time, then name). queue_map is that one rule, used by everything that
maps a namespace to its queue, so the answer never depends on the order a cache lists the queues in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import Field, ValidationError

from fairgpu.errors import ScenarioError
from fairgpu.k8s.identity import QUEUE_LABEL
from fairgpu.model import QueueSpec
from fairgpu.spec import QueueDoc, validation_message

EXCLUSIVE = "NamespacesExclusive"  # a queue's condition, False: an older queue serves some of its namespaces
SHADOWED = "NamespaceClaimedByOlderQueue"  # its reason, and the Warning Event's


class QueueCrSpec(QueueDoc):
    name: str = Field(default="", exclude=True)  # comes from metadata.name
    namespaces: list[str] = Field(default_factory=list)  # who may submit; empty = only by label, from anywhere


@dataclass(slots=True)
class QueueEntry:
    spec: QueueSpec
    namespaces: tuple[str, ...]
    created: str = ""  # metadata.creationTimestamp (RFC 3339 in UTC: sorts as text)


def queue_from_cr(obj: dict) -> QueueEntry:
    """Raises ScenarioError naming the field (`spec.weight: ...`)."""
    name = obj["metadata"]["name"]
    try:
        doc = QueueCrSpec.model_validate({**(obj.get("spec") or {}), "name": name})
    except ValidationError as err:
        raise ScenarioError(f"spec.{validation_message(err)}") from err
    return QueueEntry(doc.to_spec(name), tuple(doc.namespaces), obj["metadata"].get("creationTimestamp") or "")


def queue_entries(objs: Iterable[dict]) -> tuple[list[QueueEntry], dict[str, str]]:
    """The valid queues, and why each other one is left out. A queue whose parent is missing (or invalid) is
    left out with its children, not the whole tree."""
    entries, errors = [], {}
    for obj in objs:
        try:
            entries.append(queue_from_cr(obj))
        except ValueError as err:
            errors[obj["metadata"]["name"]] = str(err)
    while True:
        names = {e.spec.name for e in entries}
        orphans = [e for e in entries if e.spec.parent is not None and e.spec.parent not in names]
        if not orphans:
            return entries, errors
        for e in orphans:
            errors[e.spec.name] = f"spec.parent: queue {e.spec.parent!r} does not exist or is invalid"
        entries = [e for e in entries if e not in orphans]


@dataclass(slots=True)
class QueueMap:
    """Which valid queues a pod may use, and the one queue serving each namespace's unlabelled pods."""

    allowed: dict[str, tuple[str, ...]]  # queue → namespaces that may use it (empty: any, by label)
    serving: dict[str, str]  # namespace → its oldest claimant
    shadowed: dict[str, str]  # queue → why an older queue serves some of its namespaces' unlabelled pods


def queue_map(entries: Iterable[QueueEntry]) -> QueueMap:
    allowed: dict[str, tuple[str, ...]] = {}
    serving: dict[str, str] = {}
    shadowed: dict[str, str] = {}
    # A queue without a creation time (not from an apiserver) counts as the youngest.
    for e in sorted(entries, key=lambda e: (not e.created, e.created, e.spec.name)):
        name = e.spec.name
        allowed[name] = e.namespaces
        for ns in e.namespaces:
            serving.setdefault(ns, name)
        lost = [f"{ns} (served by {serving[ns]!r})" for ns in e.namespaces if serving[ns] != name]
        if lost:
            shadowed[name] = (
                f"shared with an older queue, which serves its unlabelled pods: namespace {', '.join(lost)}; "
                f"pods there labelled {QUEUE_LABEL}={name} still use this queue"
            )
    return QueueMap(allowed, serving, shadowed)
