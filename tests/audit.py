"""The chaos soak's independent auditor (issue 11, item 8). It shares no code with fairgpu: it replays the
fake apiserver's store history (every committed write, in order), its request log and its admission log,
and counts violations of what users rely on:
- overcommit: at some moment the pods bound to a GPU (read from their HAMi records) exceed its cores,
  memory or task count;
- partial_gangs: at the end (after the run settled), a gang runs with fewer than its minimum members (gangs
  the chaos itself cut, by deleting a node under them, are not counted);
- non_leader_binds: a Binding written by a replica that was not the lease's holder at that moment;
- lost_pods: at the end (after the run settled), a pod neither bound nor pending with a PodScheduled=False
  reason;
- over_limit: at some moment a tenant's bound GPUs exceed its queue's limit;
- unchecked_pods: a pod stored without every named admission webhook having allowed it and without the
  mutating webhook's user stamp (admitted while the webhook was down, say);
- stuck_replicas: filled by the run, not the replay: a replica that did not stop when it was cancelled.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

REGISTER = "hami.io/node-nvidia-register"
ALLOCATED = "hami.io/vgpu-devices-allocated"
GROUP, MIN = "fairgpu.io/pod-group", "fairgpu.io/min-members"
STAMP = "fairgpu.io/user-name"  # what the mutating webhook writes on every pod it admits


def _devices(value: str) -> list[tuple[str, int, int]]:
    """(uuid, memory MiB, cores) of every device in a HAMi allocation record."""
    out = []
    for seg in value.split(";"):
        for dev in (d for d in seg.split(":") if d):
            uuid, _vendor, mem, cores = dev.split(",")
            out.append((uuid, int(mem), int(cores)))
    return out


def _running(pod: dict) -> bool:
    return bool(pod["spec"].get("nodeName")) and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


@dataclass
class Audit:
    overcommit: list[str] = field(default_factory=list)
    partial_gangs: list[str] = field(default_factory=list)
    non_leader_binds: list[str] = field(default_factory=list)
    lost_pods: list[str] = field(default_factory=list)
    over_limit: list[str] = field(default_factory=list)
    unchecked_pods: list[str] = field(default_factory=list)
    stuck_replicas: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.__dict__.items()}


def audit(
    store,
    requests: list[dict],
    limits: dict[str, float],
    cut_gangs: set[str],
    admission: tuple[list[dict], tuple[str, ...], set[str]] | None = None,
) -> Audit:
    """Replay every committed write; check the moment after each pod write, and the final state. `admission`:
    (the fake's webhook calls, the webhooks every pod in `namespaces` must have passed, those namespaces)."""
    out = Audit()
    capacity: dict[str, tuple[int, int]] = {}  # uuid → (memory, tasks)
    held: dict[str, list[tuple[str, int, int]]] = {}  # pod key → its devices while it runs
    use: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # uuid → cores, memory, tasks
    tenant_gpus: dict[str, float] = defaultdict(float)
    allowed: dict[str, set[str]] = defaultdict(set)  # pod name → webhooks that allowed it
    for call in admission[0] if admission else ():
        if call.get("outcome") == "allowed":
            allowed[call["name"]].add(call["webhook"])
    for entry in store.log:
        plural = entry.resource.plural
        if plural == "nodes" and entry.type != "DELETED":
            for d in json.loads((entry.obj["metadata"].get("annotations") or {}).get(REGISTER, "[]")):
                capacity[d["id"]] = (int(d["devmem"]), int(d["count"]))
            continue
        if plural != "pods":
            continue
        meta = entry.obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        ann = meta.get("annotations") or {}
        if admission and entry.type == "ADDED" and meta["namespace"] in admission[2]:
            missing = [h for h in admission[1] if h not in allowed[meta["name"]]]
            if missing or STAMP not in ann:
                out.unchecked_pods.append(f"rev {entry.rev}: {key} stored without {missing or [STAMP]}")
        now = _running(entry.obj) and entry.type != "DELETED" and ALLOCATED in ann
        before = held.pop(key, None)
        if before is not None:
            for uuid, mem, cores in before:
                u = use[uuid]
                u[0], u[1], u[2] = u[0] - cores, u[1] - mem, u[2] - 1
                tenant_gpus[meta["namespace"]] -= cores / 100
        if not now:
            continue
        devices = _devices(ann[ALLOCATED])
        held[key] = devices
        for uuid, mem, cores in devices:
            u = use[uuid]
            u[0], u[1], u[2] = u[0] + cores, u[1] + mem, u[2] + 1
            tenant_gpus[meta["namespace"]] += cores / 100
            cap_mem, cap_tasks = capacity.get(uuid, (0, 0))
            if u[0] > 100 or u[1] > cap_mem or u[2] > cap_tasks:
                out.overcommit.append(f"rev {entry.rev}: {uuid} cores {u[0]} mem {u[1]} tasks {u[2]} ({key})")
        limit = limits.get(meta["namespace"])
        if limit is not None and tenant_gpus[meta["namespace"]] > limit + 1e-9:
            out.over_limit.append(f"rev {entry.rev}: {meta['namespace']} holds {tenant_gpus[meta['namespace']]:g}")
    out.lost_pods, out.partial_gangs = end_state(store, cut_gangs)
    # Bindings against the lease's holder at their moment (both from the request log, in commit order).
    holder = None
    for r in sorted(requests, key=lambda r: r["t"]):
        if r["code"] >= 300:
            continue
        if "/leases" in r["path"] and r["verb"] in ("PUT", "POST"):
            holder = r["agent"]
        elif r["path"].endswith("/binding") and r["verb"] == "POST" and r["agent"] != holder:
            out.non_leader_binds.append(f"{r['path']} by {r['agent']!r} while {holder!r} held the lease")
    return out


def end_state(store, cut_gangs: set[str]) -> tuple[list[str], list[str]]:
    """(lost pods, partial gangs) in the store as it is now."""
    lost: list[str] = []
    partial: list[str] = []
    groups: dict[str, list[dict]] = defaultdict(list)
    for (_, plural, ns, _name), obj in store.objects.items():
        if plural != "pods":
            continue
        labels = obj["metadata"].get("labels") or {}
        if GROUP in labels:
            groups[f"{ns}/{labels[GROUP]}"].append(obj)
        if obj["spec"].get("nodeName") or obj["metadata"].get("deletionTimestamp"):
            continue
        conds = (obj.get("status") or {}).get("conditions") or []
        if not any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message") for c in conds):
            lost.append(f"{ns}/{obj['metadata']['name']}")
    for gid, members in groups.items():
        need = int((members[0]["metadata"]["labels"]).get(MIN, "1"))
        running = sum(1 for m in members if _running(m))
        if 0 < running < need and gid not in cut_gangs:
            partial.append(f"{gid}: {running} of {need} run")
    return lost, partial
