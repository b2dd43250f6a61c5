"""The dashboard's JSON documents, one per view (docs/dashboard.md), read from a scheduler."""

from __future__ import annotations

from typing import Any

import numpy as np

from fairgpu import resources as r
from fairgpu.framework.scheduler import Scheduler
from fairgpu.observe.accounting import gpu_accounting
from fairgpu.observe.history import QueueHistory

MAX_WORKLOADS = 500  # one page of the workload picker at most; ?offset= pages, ?queue= and ?search= narrow


def cluster_view(sched: Scheduler) -> dict[str, Any]:
    """Totals per GPU model and a node × GPU heat map; vectorised, since clusters reach thousands of nodes."""
    st = sched.state
    acc = gpu_accounting(st)
    pending, running = sched.workload_counts()
    cores = np.where(st.gpu_valid, st.gpu_cores_cap - st.gpu_cores_free, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mem_pct = np.where(st.gpu_valid, np.rint(100 * (1 - st.gpu_mem_free / st.gpu_mem_cap)), -1)
    return {
        "totals": {
            "nodes": st.num_nodes,
            "gpus": st.total_gpus,
            "allocated_gpus": float(acc.allocated.sum()),
            "free_gpus": float(acc.free.sum()),
            "fragmented_gpus": float(acc.fragmented.sum()),
            "running_workloads": int(running.sum()),
            "pending_workloads": int(pending.sum()),
        },
        # idle GPU-equivalents by cause, as of the engine's last cycle (they sum to its idle GPUs)
        "idle_gpus": sched.idle_gpus(sched.view.now),
        "models": acc.by_model(st),
        # -1 marks a slot without a GPU (nodes with fewer GPUs than the largest)
        "heatmap": {
            "nodes": st.node_names,
            "models": st.models,
            "model": st.gpu_model.tolist(),
            "cores_pct": cores.tolist(),
            "memory_pct": mem_pct.astype(np.int64).tolist(),
        },
    }


def node_view(sched: Scheduler, name: str) -> dict[str, Any]:
    """Raises KeyError for an unknown node."""
    st = sched.state
    n = st.node_index[name]
    gpus: list[dict[str, Any]] = [
        {
            "index": j,
            "uuid": dev.uuid,
            "model": dev.model,
            "healthy": dev.healthy,
            "cores_allocated": int(st.gpu_cores_cap[n, j] - st.gpu_cores_free[n, j]),
            "memory_allocated_mib": int(st.gpu_mem_cap[n, j] - st.gpu_mem_free[n, j]),
            "memory_total_mib": int(st.gpu_mem_cap[n, j]),
            "pods": [],
        }
        for j, dev in enumerate(st.nodes[n].gpus)
    ]
    cpu_pods = []
    # Every pod the state holds: a live scheduler also pins pods it found running that are not its own
    # workloads (another scheduler's, or without a queue): their workload and queue are null.
    owners = {w.pod_names[i]: w for w in sched.workloads() for i in range(w.placed)}
    for key in st.placed_keys():
        p = st.placement(key)
        # a dry run's pod (its key starts with NUL) is never shown: this view may be read from the server's
        # thread while the engine's cycle runs one in place
        if p is None or p.node != n or key.startswith("\0"):
            continue
        wl = owners.get(key)
        pod = {"pod": key, "workload": wl.name if wl else None, "queue": wl.queue if wl else None}
        if not p.slots:
            cpu_pods.append(pod)
        for s, cores, mem in zip(p.slots, p.cores, p.mem_mib, strict=True):
            gpus[s]["pods"].append({**pod, "cores": cores, "memory_mib": mem})
    return {
        "node": name,
        "schedulable": bool(st.schedulable[n]),
        "cpu_m": {"allocated": int(st.cpu_cap[n] - st.cpu_free[n]), "total": int(st.cpu_cap[n])},
        "memory_mib": {"allocated": int(st.mem_cap[n] - st.mem_free[n]), "total": int(st.mem_cap[n])},
        "gpus": gpus,
        "cpu_only_pods": cpu_pods,
    }


def _vector(values: np.ndarray) -> dict[str, float | None]:
    return {d: (float(x) if np.isfinite(x) else None) for d, x in zip(r.FAIR_DIMS, values, strict=True)}


def queue_view(sched: Scheduler, history: QueueHistory) -> dict[str, Any]:
    """The tree with each queue's current usage, fair share, guarantee and limit, and their history."""
    tree, v = sched.tree, sched.view
    pending, _ = sched.workload_counts()
    usage = np.stack(history.usage) if history.t else np.zeros((0, len(tree), len(r.FAIR_DIMS)))
    entitled = np.stack(history.entitled) if history.t else usage
    queues = []
    for q, spec in enumerate(tree.queues):
        queues.append(
            {
                "name": spec.name,
                "parent": spec.parent,
                "children": [tree.queues[c].name for c in tree.children[q]],
                "weight": spec.weight,
                "usage": _vector(v.usage[q]),
                "fair_share": _vector(v.entitled[q]),
                "guaranteed": _vector(tree.guaranteed[q]),
                "limit": _vector(tree.limit[q]),
                "usage_dominant": float(v.usage_dom[q]),
                "fair_share_dominant": float(v.entitled_dom[q]),
                "pending_workloads": int(pending[q]),
                "history": {
                    d: {"usage": usage[:, q, k].tolist(), "fair_share": entitled[:, q, k].tolist()}
                    for k, d in enumerate(r.FAIR_DIMS)
                },
            }
        )
    return {
        "resources": list(r.FAIR_DIMS),
        "capacity": _vector(v.capacity),
        "roots": [tree.queues[i].name for i in tree.roots],
        "times": list(history.t),
        "queues": queues,
    }


def workloads_view(
    sched: Scheduler, queue: str | None = None, search: str = "", offset: int = 0, limit: int = MAX_WORKLOADS
) -> dict[str, Any]:
    """Pending and running workloads, oldest first, one page of each: `queue` and `search` (a substring
    of the name) narrow both lists, and the totals count what they match, not the page."""
    if queue is not None and queue not in sched.tree.index:
        raise ValueError(f"queue: {queue!r} is not a queue")
    if offset < 0 or not 0 < limit <= MAX_WORKLOADS:
        raise ValueError(f"offset must be ≥ 0 and limit in 1..{MAX_WORKLOADS}")
    needle = search.lower()

    def rows(state: str) -> list[dict[str, Any]]:
        return [
            {"workload": w.name, "queue": w.queue, "state": state, "submitted": w.submitted, "pods": w.pods,
             "placed": w.placed}
            for w in chosen[state][offset : offset + limit]
        ]  # fmt: skip

    chosen = {s: [w for w in sched.workloads(s, queue) if needle in w.name.lower()] for s in ("pending", "running")}
    return {
        "pending": rows("pending"),
        "running": rows("running"),
        "pending_total": len(chosen["pending"]),
        "running_total": len(chosen["running"]),
        "offset": offset,
        "limit": limit,
    }
