"""Queue custom resources (queues.fairgpu.io/v1alpha1, cluster-scoped) → QueueSpec.

The spec mirrors a scenario's queue keys and is validated by the same model, so a queue means the same in
the simulator and in the cluster. An invalid spec is reported (the caller sets a status condition) and the
queue is left out; it never stops the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field, ValidationError

from fairgpu import resources as r
from fairgpu.model import QueueSpec
from fairgpu.sim.scenario import QueueDoc, parse_duration


class QueueCrSpec(QueueDoc):
    name: str = Field(default="", exclude=True)  # comes from metadata.name
    namespaces: list[str] = Field(default_factory=list)  # who may submit; empty = only by label, from anywhere


@dataclass(slots=True)
class QueueEntry:
    spec: QueueSpec
    namespaces: tuple[str, ...]


def queue_from_cr(obj: dict) -> QueueEntry:
    """Raises ValueError naming the field (`spec.weight: ...`)."""
    name = obj["metadata"]["name"]
    try:
        doc = QueueCrSpec.model_validate({**(obj.get("spec") or {}), "name": name})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"spec.{where}: {first['msg']}") from err
    guaranteed = r.quota_vector(doc.guaranteed, default=np.inf) if doc.guaranteed else r.zeros()
    spec = QueueSpec(
        name,
        doc.weight,
        guaranteed,
        r.quota_vector(doc.limit, default=np.inf),
        doc.parent,
        usage_half_life=parse_duration(doc.usage_half_life),
        fair_within=doc.fair_within,
        starvation_after=parse_duration(doc.starvation_after),
    )
    return QueueEntry(spec, tuple(doc.namespaces))
