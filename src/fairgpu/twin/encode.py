"""The engine's data as trace records (twin/schema.py defines and reads them): what the recorder writes."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from fairgpu import resources as r
from fairgpu.model import GpuDevice, NodeSpec, PodSpec, QueueSpec, Workload
from fairgpu.twin.schema import SCHEMA, VERSION


def node_doc(n: NodeSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": n.name, "cpu_m": n.cpu_m, "memory_mib": n.memory_mib}
    doc["gpus"] = [_gpu_doc(g) for g in n.gpus]
    doc |= {"labels": dict(n.labels), "split_count": n.split_count, "schedulable": n.schedulable}
    doc["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in n.taints]
    if n.pair_scores:
        doc["pair_scores"] = [list(row) for row in n.pair_scores]
    return doc


def _gpu_doc(g: GpuDevice) -> dict[str, Any]:
    """A card; devcore, NUMA node and MIG profiles only when they are not the defaults (older readers)."""
    doc = {"model": g.model, "memory_mib": g.memory_mib, "uuid": g.uuid, "healthy": g.healthy, "split": g.split}
    doc["mode"] = g.mode
    if g.cores != 100:
        doc["cores"] = g.cores
    if g.numa:
        doc["numa"] = g.numa
    if g.mig:
        doc["mig"] = [
            {"name": m.name, "memory_mib": m.memory_mib, "cores": m.cores, "slices": m.slices,
             "placements": [list(p) for p in m.placements]}
            for m in g.mig
        ]  # fmt: skip
    return doc


def pod_doc(p: PodSpec) -> dict[str, Any]:
    g = p.gpu
    doc: dict[str, Any] = {"cpu_m": p.cpu_m, "memory_mib": p.memory_mib}
    if g is not None:
        doc["gpu"] = {"count": g.count, "cores": g.cores, "mem_mib": g.mem_mib, "mem_pct": g.mem_pct}
    if p.more_gpus:
        doc["more_gpus"] = [{"count": m.count, "cores": m.cores, "mem_mib": m.mem_mib, "mem_pct": m.mem_pct}
                            for m in p.more_gpus]  # fmt: skip
    if p.numa_bind:
        doc["numa_bind"] = True
    for name in ("gpu_include", "gpu_exclude", "gpu_uuid_include", "gpu_uuid_exclude"):
        if getattr(p, name):
            doc[name] = list(getattr(p, name))
    if p.node_selector:
        doc["node_selector"] = dict(p.node_selector)
    if p.affinity:
        doc["affinity"] = [
            [{"key": e.key, "operator": e.operator, "values": list(e.values)} for e in term] for term in p.affinity
        ]
    if p.tolerations:
        doc["tolerations"] = [
            {"key": t.key, "operator": t.operator, "value": t.value, "effect": t.effect} for t in p.tolerations
        ]
    for name in ("node_policy", "gpu_policy"):
        if getattr(p, name):
            doc[name] = getattr(p, name)
    if p.gpu_weights != (1, 1, 1):
        doc["gpu_weights"] = list(p.gpu_weights)
    if p.gpu_mode is not None:
        doc["gpu_mode"] = p.gpu_mode
    return doc


def _quota(vec: np.ndarray) -> dict[str, str | float]:
    """A fair vector as the quota keys a queue is written with; unconstrained (infinite) dimensions left out."""
    out: dict[str, str | float] = {}
    for dim, value in enumerate(vec):
        if not math.isfinite(value):
            continue
        if dim == r.DIM_GPU:
            out[r.GPU] = float(value)
        elif dim == r.DIM_GPUMEM:
            out[r.GPUMEM] = f"{int(value)}Mi"
        elif dim == r.DIM_CPU:
            out[r.CPU] = f"{int(value)}m"
        else:
            out[r.MEMORY] = f"{int(value)}Mi"
    return out


def queue_doc(q: QueueSpec) -> dict[str, Any]:
    """A QueueSpec as the queue schema (spec.QueueDoc) writes it: what `--queues FILE` takes, too."""
    doc: dict[str, Any] = {"name": q.name, "weight": q.weight}
    if q.parent is not None:
        doc["parent"] = q.parent
    if np.any(q.guaranteed):
        doc["guaranteed"] = _quota(q.guaranteed)
    if np.isfinite(q.limit).any():
        doc["limit"] = _quota(q.limit)
    if q.lendable is not None:
        doc["lendable"] = _quota(q.lendable)
    doc |= {
        "usage_half_life": q.usage_half_life,
        "fair_within": q.fair_within,
        "starvation_after": q.starvation_after,
        "allocation": q.allocation,
    }
    p = q.preemption
    if not p.enabled:
        doc["preemption"] = "never"
    else:
        doc["preemption"] = {
            "reclaim": p.reclaim,
            "fair_share": p.fair_share,
            "within_queue": p.within_queue,
            "min_runtime": p.min_runtime,
            "grace_period": p.grace_period,
            "fair_share_max_runtime": None if math.isinf(p.fair_share_max_runtime) else p.fair_share_max_runtime,
        }
    return doc


def submit_record(t: float, wl: Workload, epoch: float) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kind": "submit",
        "t": t,
        "workload": wl.name,
        "queue": wl.queue,
        "submitted": wl.submit_time - epoch,
        "pods": [pod_doc(p) for p in wl.pods],
        "pod_names": list(wl.pod_names),
    }
    if wl.user:
        doc["user"] = wl.user
    if wl.priority:
        doc["priority"] = wl.priority
    if wl.duration is not None:
        doc["duration"] = wl.duration
    if wl.min_pods is not None:
        doc["min_pods"] = wl.min_pods
    if not wl.preemptible:
        doc["preemptible"] = False
    return doc


def header(epoch: float, source: str, scheduler: str, profile: str) -> dict[str, Any]:
    return {
        "kind": "header",
        "schema": SCHEMA,
        "version": VERSION,
        "epoch": epoch,
        "source": source,
        "scheduler": scheduler,
        "profile": profile,
    }


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), allow_nan=False)
