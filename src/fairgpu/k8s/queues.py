"""Queue custom resources (queues.fairgpu.io/v1alpha1, cluster-scoped) → QueueSpec.

The spec mirrors a scenario's queue keys and is validated by the same model, so a queue means the same in
the simulator and in the cluster. An invalid spec is reported (the caller sets a status condition) and the
queue is left out; it never stops the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import Field, ValidationError

from fairgpu.errors import ScenarioError
from fairgpu.model import QueueSpec
from fairgpu.spec import QueueDoc, validation_message


class QueueCrSpec(QueueDoc):
    name: str = Field(default="", exclude=True)  # comes from metadata.name
    namespaces: list[str] = Field(default_factory=list)  # who may submit; empty = only by label, from anywhere


@dataclass(slots=True)
class QueueEntry:
    spec: QueueSpec
    namespaces: tuple[str, ...]


def queue_from_cr(obj: dict) -> QueueEntry:
    """Raises ScenarioError naming the field (`spec.weight: ...`)."""
    name = obj["metadata"]["name"]
    try:
        doc = QueueCrSpec.model_validate({**(obj.get("spec") or {}), "name": name})
    except ValidationError as err:
        raise ScenarioError(f"spec.{validation_message(err)}") from err
    return QueueEntry(doc.to_spec(name), tuple(doc.namespaces))


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
