"""`fairgpu import kueue FILE`: Kueue's ClusterQueues, Cohorts and LocalQueues as fairgpu Queue resources.

Kueue → fairgpu: a Cohort becomes an inner queue and a ClusterQueue a leaf under its cohort; nominalQuota
(summed over flavors: fairgpu has no resource flavors) is the guarantee, nominalQuota + borrowingLimit the
limit, lendingLimit what may be lent; fairSharing.weight is the weight; LocalQueues contribute their
namespace. Whatever has no fairgpu meaning is reported, one line per field, never dropped silently."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from fairgpu import resources as r
from fairgpu.errors import InputError, QuantityError
from fairgpu.spec import QueueDoc, validation_message

KUEUE_GROUP = "kueue.x-k8s.io"
MAPPED_RESOURCES = (r.GPU, r.GPUCORES, r.GPUMEM, r.CPU, r.MEMORY)
# ClusterQueue spec keys handled below; any other key is reported
_CQ_KEYS = {"cohort", "cohortName", "resourceGroups", "fairSharing", "preemption", "namespaceSelector"}
_COHORT_KEYS = {"parent", "parentName", "resourceGroups", "fairSharing"}


@dataclass(slots=True)
class Imported:
    queues: list[dict[str, Any]] = field(default_factory=list)  # Queue resources, parents first
    notes: list[str] = field(default_factory=list)  # one per field that could not be mapped


def _quota(where: str, groups: list[dict], notes: list[str]) -> tuple[dict, dict, dict]:
    """(guaranteed, limit, lendable) summed over flavors, as quantities."""
    nominal: dict[str, Decimal] = defaultdict(Decimal)
    borrow: dict[str, Decimal | None] = {}
    lend: dict[str, Decimal | None] = {}
    flavors: set[str] = set()
    for gi, group in enumerate(groups or []):
        for fi, flavor in enumerate(group.get("flavors") or []):
            flavors.add(str(flavor.get("name")))
            for ri, res in enumerate(flavor.get("resources") or []):
                name = res.get("name")
                at = f"{where}.resourceGroups[{gi}].flavors[{fi}].resources[{ri}]"
                if name not in MAPPED_RESOURCES:
                    notes.append(f"{at}: resource {name!r} has no fairgpu quota (only {', '.join(MAPPED_RESOURCES)})")
                    continue
                try:
                    amount = r.parse_quantity(res.get("nominalQuota", 0))
                    nominal[name] += amount
                    for key, into in (("borrowingLimit", borrow), ("lendingLimit", lend)):
                        if key in res:
                            extra = r.parse_quantity(res[key])
                            prev = into.get(name, Decimal(0))
                            into[name] = None if prev is None else prev + (amount + extra if into is borrow else extra)
                        else:
                            into[name] = None  # unbounded on this flavor: unbounded in sum
                except QuantityError as err:
                    raise InputError(f"{at}: {err}") from None
    if len(flavors) > 1:
        notes.append(f"{where}.resourceGroups: flavors {', '.join(sorted(flavors))} are summed (fairgpu has no "
                     "resource flavors; steer pods with gpu_include / node selectors instead)")  # fmt: skip

    def out(d: dict) -> dict[str, str]:
        return {k: _fmt(v, k) for k, v in d.items() if v is not None}

    limit = {k: v for k, v in borrow.items() if v is not None and k in nominal}
    lendable = {k: v for k, v in lend.items() if v is not None}
    return out(dict(nominal)), out(limit), out(lendable)


def _fmt(v: Decimal, resource: str) -> str:
    """Memory keeps a unit (fairgpu refuses a bare byte count as a likely mistake): the largest binary
    suffix that divides it, else decimal kilobytes."""
    if resource == r.MEMORY and v != 0:
        for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if v % size == 0:
                return f"{v // size}{suffix}"
        return f"{format((v / 1000).normalize(), 'f')}k"
    return format(v.normalize(), "f")


def _preemption(where: str, pre: dict | None, notes: list[str]) -> dict[str, Any]:
    pre = pre or {}
    doc: dict[str, Any] = {}
    reclaim = pre.get("reclaimWithinCohort", "Never")
    doc["reclaim"] = reclaim != "Never"
    if reclaim == "LowerPriority":
        notes.append(f"{where}.preemption.reclaimWithinCohort: LowerPriority taken as reclaim of any borrowed work")
    within = pre.get("withinClusterQueue", "Never")
    doc["within_queue"] = "Never" if within == "Never" else "LowerPriority"
    if within == "LowerOrNewerEqualPriority":
        notes.append(f"{where}.preemption.withinClusterQueue: LowerOrNewerEqualPriority taken as LowerPriority")
    if pre.get("borrowWithinCohort"):
        notes.append(f"{where}.preemption.borrowWithinCohort: not mapped (fairgpu never preempts to borrow)")
    for key in sorted(set(pre) - {"reclaimWithinCohort", "withinClusterQueue", "borrowWithinCohort"}):
        notes.append(f"{where}.preemption.{key}: not mapped")
    return doc


def _queue(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    try:
        QueueDoc.model_validate({"name": name, **{k: v for k, v in spec.items() if k != "namespaces"}})
    except ValidationError as err:
        raise InputError(f"queue {name}: {validation_message(err)}") from None
    return {"apiVersion": "fairgpu.io/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def import_kueue(docs: list[Any], source: str) -> Imported:
    """Queue resources from Kueue documents (a List's items count too). Raises InputError."""
    items: list[dict] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind", "").endswith("List"):
            items += doc.get("items") or []
        elif doc is not None:
            items.append(doc)
    out = Imported()
    specs: dict[str, dict[str, Any]] = {}
    parents: dict[str, str | None] = {}
    namespaces: dict[str, set[str]] = defaultdict(set)
    local: list[tuple[str, str, str]] = []
    for i, obj in enumerate(items):
        if not isinstance(obj, dict) or not str(obj.get("apiVersion", "")).startswith(KUEUE_GROUP):
            kind = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
            out.notes.append(f"{source}: document {i + 1} ({kind}) is not a Kueue object: skipped")
            continue
        kind, meta, spec = obj.get("kind"), obj.get("metadata") or {}, obj.get("spec") or {}
        name = meta.get("name")
        if not name:
            raise InputError(f"{source}: document {i + 1} ({kind}): metadata.name is missing")
        where = f"{kind}/{name}.spec"
        if kind == "LocalQueue":
            local.append((meta.get("namespace") or "default", name, spec.get("clusterQueue", "")))
            continue
        if kind not in ("ClusterQueue", "Cohort"):
            out.notes.append(f"{kind}/{name}: no fairgpu counterpart: skipped")
            continue
        if name in specs:
            raise InputError(f"{source}: {kind}/{name}: a queue of that name is defined twice")
        known = _CQ_KEYS if kind == "ClusterQueue" else _COHORT_KEYS
        for key in sorted(set(spec) - known):
            out.notes.append(f"{where}.{key}: not mapped")
        guaranteed, limit, lendable = _quota(where, spec.get("resourceGroups") or [], out.notes)
        q: dict[str, Any] = {}
        parent = spec.get("cohort") or spec.get("cohortName") or spec.get("parent") or spec.get("parentName")
        parents[name] = parent
        if parent:
            q["parent"] = parent
        weight = (spec.get("fairSharing") or {}).get("weight")
        if weight is not None:
            q["weight"] = float(r.parse_quantity(weight))
            if q["weight"] <= 0:
                out.notes.append(f"{where}.fairSharing.weight: {weight} (fairgpu needs a positive weight): 1 used")
                q["weight"] = 1.0
        if guaranteed:
            q["guaranteed"] = guaranteed
        if limit:
            q["limit"] = limit
        if lendable:
            q["lendable"] = lendable
        if kind == "ClusterQueue":
            q["preemption"] = _preemption(where, spec.get("preemption"), out.notes)
            if "namespaceSelector" in spec:
                out.notes.append(f"{where}.namespaceSelector: not mapped (fairgpu lists namespaces; taken from "
                                 "the LocalQueues pointing here)")  # fmt: skip
        specs[name] = q
    for ns, lq, cq in local:
        if cq not in specs:
            out.notes.append(f"LocalQueue {ns}/{lq}: clusterQueue {cq!r} is not in {source}: skipped")
            continue
        namespaces[cq].add(ns)
        if lq != cq:
            out.notes.append(f"LocalQueue {ns}/{lq}: pods of {ns} go to queue {cq} (label fairgpu.io/queue={cq})")
    for cohort in {p for p in parents.values() if p} - set(specs):  # cohorts named only by reference
        specs[cohort], parents[cohort] = {}, None
    for name in _parents_first(parents):
        spec = specs[name]
        if namespaces.get(name):
            spec["namespaces"] = sorted(namespaces[name])
        out.queues.append(_queue(name, spec))
    return out


def _parents_first(parents: dict[str, str | None]) -> list[str]:
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in seen:
            return
        if name in path:
            raise InputError(f"cohorts form a cycle: {' → '.join((*path, name))}")
        parent = parents.get(name)
        if parent:
            visit(parent, (*path, name))
        seen.add(name)
        order.append(name)

    for name in sorted(parents):
        visit(name, ())
    return order
