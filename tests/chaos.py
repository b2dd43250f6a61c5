"""A chaos soak of the live scheduler and its independent auditor (issue 11, item 8).

Two or more controller replicas with leader election run against the wire-level fake while it answers
random 5xx, 409 and 429, loses answers of committed writes, drops watches, and while leaders are killed
and nodes deleted (their pods collected, as the pod GC does). Pods of several tenants arrive over time
(whole GPUs, fractions, gangs), run for a while and finish.

The auditor shares no code with fairgpu: it replays the fake's store history (every committed write, in
order) and its request log, and counts violations of what users rely on:
- overcommit: at some moment the pods bound to a GPU (read from their HAMi records) exceed its cores,
  memory or task count;
- partial_gangs: at the end, a gang runs with fewer than its minimum members (gangs the chaos itself cut,
  by deleting a node under them, are not counted);
- non_leader_binds: a Binding written by a replica that was not the lease's holder at that moment;
- lost_pods: at the end, a pod neither bound nor pending with a PodScheduled=False reason;
- over_limit: at some moment a tenant's bound GPUs exceed its queue's limit.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from fairgpu.catalog import load_profile
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.port import NODES, QUEUES, Kind
from fakeapi.server import _BY_PATH, FakeApiServer
from fakeapi.store import clone

T = TypeVar("T")
QUIET_S = 10.0
REGISTER = "hami.io/node-nvidia-register"
ALLOCATED = "hami.io/vgpu-devices-allocated"
GROUP, MIN = "fairgpu.io/pod-group", "fairgpu.io/min-members"
POD_RES = _BY_PATH[("", "v1", "pods")]
NAMESPACE = Kind("", "v1", "namespaces", False)
LEASE_NAMESPACE = "fairgpu-system"
NODE_RES = _BY_PATH[("", "v1", "nodes")]
GPU_MEM, SPLIT = 40960, 4


# -- the cluster ----------------------------------------------------------------------------------------
def chaos_node(i: int, gpus: int) -> dict:
    devices = [
        {
            "id": f"GPU-{i:03d}-{j}",
            "count": SPLIT,
            "devmem": GPU_MEM,
            "devcore": 100,
            "type": "NVIDIA A40",
            "health": True,
            "index": j,
        }
        for j in range(gpus)
    ]
    return {
        "metadata": {"name": f"node-{i:03d}", "annotations": {REGISTER: json.dumps(devices)}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus * SPLIT)}},
    }


def chaos_pod(ns: str, name: str, limits: dict, labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {
            "schedulerName": "fairgpu",
            "containers": [{"name": "main", "image": "x", "resources": {"limits": limits, "requests": {"cpu": "1"}}}],
        },
    }


def workload(rng: random.Random, tenant: str, i: int) -> list[dict]:
    """One arrival: a whole-GPU pod, a fraction, a 2-GPU pod, or a gang of 2–4 one-GPU pods."""
    roll = rng.random()
    if roll < 0.35:
        return [chaos_pod(tenant, f"w{i}", {"nvidia.com/gpu": "1"})]
    if roll < 0.7:
        cores, mem = rng.choice([(25, 8000), (50, 16000), (30, 10000)])
        frac = {"nvidia.com/gpu": "1", "nvidia.com/gpucores": str(cores), "nvidia.com/gpumem": str(mem)}
        return [chaos_pod(tenant, f"f{i}", frac)]
    if roll < 0.85:
        return [chaos_pod(tenant, f"d{i}", {"nvidia.com/gpu": "2"})]
    size = rng.randint(2, 4)
    labels = {GROUP: f"g{i}", MIN: str(size)}
    return [chaos_pod(tenant, f"g{i}-{j}", {"nvidia.com/gpu": "1"}, labels) for j in range(size)]


# -- the auditor ----------------------------------------------------------------------------------------
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

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.__dict__.items()}


def audit(store, requests: list[dict], limits: dict[str, float], cut_gangs: set[str]) -> Audit:
    """Replay every committed write; check the moment after each pod write, and the final state."""
    out = Audit()
    capacity: dict[str, tuple[int, int]] = {}  # uuid → (memory, tasks)
    held: dict[str, list[tuple[str, int, int]]] = {}  # pod key → its devices while it runs
    use: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # uuid → cores, memory, tasks
    tenant_gpus: dict[str, float] = defaultdict(float)
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
    # The end state.
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
            out.lost_pods.append(f"{ns}/{obj['metadata']['name']}")
    for gid, members in groups.items():
        need = int((members[0]["metadata"]["labels"]).get(MIN, "1"))
        running = sum(1 for m in members if _running(m))
        if 0 < running < need and gid not in cut_gangs:
            out.partial_gangs.append(f"{gid}: {running} of {need} run")
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


# -- the run --------------------------------------------------------------------------------------------
@dataclass
class Replica:
    ident: str
    port: KubeClient
    elector: LeaderElector
    ctl: Controller
    tasks: list[asyncio.Task]


@dataclass
class Chaos:
    seed: int
    nodes: int = 24
    gpus: int = 4
    pods: int = 300
    tenants: int = 4
    arrival_s: float = 20.0  # pods arrive over this long
    run_s: tuple[float, float] = (0.5, 3.0)  # how long a pod runs once all of its workload runs
    limit_s: float = 90.0  # hard bound on the whole run
    lease: tuple[float, float, float] = (3.0, 2.0, 0.25)  # duration, renew deadline, retry period
    kill_every: float = 8.0  # a leader is killed this often
    node_deletions: int = 2
    fault_rate: float = 0.02
    faults: dict[str, int] = field(default_factory=dict)


async def _start(kubeconfig: str, ident: str, lease: tuple[float, float, float]) -> Replica:
    port = await KubeClient.connect(kubeconfig)
    port.api.user_agent = f"fairgpu/{ident}"
    duration, renew, retry = lease
    elector = LeaderElector(port, LEASE_NAMESPACE, "fairgpu", ident, duration, retry, renew)
    ctl = Controller(port, load_profile("fairgpu"), leadership=elector)
    ctl.retry_every = 0.5
    tasks = [asyncio.create_task(elector.run()), asyncio.create_task(ctl.run())]
    return Replica(ident, port, elector, ctl, tasks)


async def _stop(r: Replica) -> None:
    for t in r.tasks:
        t.cancel()
    await asyncio.gather(*r.tasks, return_exceptions=True)
    await r.port.close()


def _inject(fake: FakeApiServer, c: Chaos) -> None:
    """Faults for the replicas only (their user agent), at random with the run's seed."""
    many = 10**9
    fake.control("seed", seed=c.seed)
    rate = c.fault_rate
    for code in (500, 503):
        fake.control("fault", code=code, count=many, rate=rate, agent_contains="fairgpu/")
    fake.control("fault", code=409, count=many, rate=rate, verb="PATCH", agent_contains="fairgpu/")
    fake.control("fault", code=429, count=many, rate=rate / 2, verb="POST", agent_contains="fairgpu/")
    for code in (0, 500):  # committed, answer lost
        fake.control("fault", code=code, count=many, rate=rate, after=True, agent_contains="fairgpu/")
    fake.control("delay", seconds=0.0, jitter=0.02, agent_contains="fairgpu/")


async def on_fake(fake: FakeApiServer, fn: Callable[[], T]) -> T:
    """Run fn on the fake's own loop (its store is not thread-safe) without blocking this loop meanwhile."""

    async def call() -> T:
        return fn()

    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), fake.loop))


async def run_chaos(fake: FakeApiServer, kubeconfig: str, c: Chaos) -> dict:
    rng = random.Random(c.seed)
    fake.api.store.log = deque(fake.api.store.log, maxlen=5_000_000)  # the auditor replays all of it
    fake.control("device-plugin")
    port = await KubeClient.connect(kubeconfig)  # the driver's own client: no faults
    port.api.user_agent = "chaos-driver"
    for i in range(c.nodes):
        await port.create(NODES, chaos_node(i, c.gpus))
    tenants = [f"t{k}" for k in range(c.tenants)]
    # The fake, like a real apiserver, creates nothing in a namespace that does not exist: the tenants' and the
    # Lease's namespaces come first (a fake started by the tests' fixture has some of them already).
    for ns in (*tenants, LEASE_NAMESPACE):
        if not await on_fake(fake, lambda ns=ns: ("", "namespaces", "", ns) in fake.api.store.objects):
            await port.create(NAMESPACE, {"metadata": {"name": ns}})
    limits = {tenants[0]: float(c.gpus * 2)}  # one tenant is capped
    for k, t in enumerate(tenants):
        spec: dict = {"namespaces": [t], "weight": 1 + k % 2}
        if t in limits:
            spec["limit"] = {"nvidia.com/gpu": str(int(limits[t]))}
        await port.create(QUEUES, {"metadata": {"name": f"q-{t}"}, "spec": spec})
    _inject(fake, c)
    kubeconfig_ = kubeconfig
    replicas = [await _start(kubeconfig_, f"r{i}", c.lease) for i in range(2)]
    started = time.monotonic()
    loop_end = started + c.limit_s
    created = 0
    pods_by_workload: list[list[str]] = []
    run_until: dict[int, float] = {}
    cut_gangs: set[str] = set()
    deleted_nodes: list[str] = []
    kills = node_kills = drops = 0
    next_kill = started + c.kill_every
    node_times = sorted(started + rng.uniform(0.2, 0.8) * c.arrival_s for _ in range(c.node_deletions))
    store = fake.api.store
    i = 0
    idle_since: float | None = None
    while time.monotonic() < loop_end:
        now = time.monotonic()
        # Arrivals, spread over arrival_s.
        due = int(min(1.0, (now - started) / c.arrival_s) * c.pods)
        while created < due:
            tenant = rng.choice(tenants)
            pods = workload(rng, tenant, i)
            i += 1
            await on_fake(fake, lambda pods=pods, tenant=tenant: [store.create(POD_RES, tenant, o) for o in pods])
            created += len(pods)
            pods_by_workload.append([f"{tenant}/{p['metadata']['name']}" for p in pods])

        # Workloads that have run long enough finish (all their pods deleted at once), as do pods the
        # eviction of a victim or a rolled back gang marked for deletion.
        def housekeeping() -> None:
            t = time.monotonic()
            pods = store.objects
            for w, keys in enumerate(pods_by_workload):
                objs = [pods.get(("", "pods", *k.split("/", 1))) for k in keys]
                live = [o for o in objs if o is not None]
                if not live:
                    continue
                # A workload that lost a pod (its node went, or its gang was rolled back) fails as a Job would.
                if len(live) < len(objs) or all((o.get("status") or {}).get("phase") == "Running" for o in live):
                    run_until.setdefault(w, t + (0.0 if len(live) < len(objs) else rng.uniform(*c.run_s)))
                if run_until.get(w, float("inf")) <= t:
                    for o in live:
                        store._write(POD_RES, "DELETED", clone(o), o)
            for o in [
                o for o in list(pods.values()) if o.get("kind") == "Pod" and o["metadata"].get("deletionTimestamp")
            ]:
                store._write(POD_RES, "DELETED", clone(o), o)

        await on_fake(fake, housekeeping)
        # A node goes, and the pods bound to it with it (pod GC); gangs cut that way are the chaos' doing.
        if node_times and now >= node_times[0]:
            node_times.pop(0)
            name = f"node-{rng.randrange(c.nodes):03d}"

            def delete_node(name: str = name) -> list[str]:
                gone = []
                obj = store.objects.get(("", "nodes", "", name))
                if obj is None:
                    return gone
                store._write(NODE_RES, "DELETED", clone(obj), obj)
                for o in [
                    o for (g, p, *_), o in store.objects.items() if p == "pods" and o["spec"].get("nodeName") == name
                ]:
                    labels = o["metadata"].get("labels") or {}
                    if GROUP in labels:
                        gone.append(f"{o['metadata']['namespace']}/{labels[GROUP]}")
                    store._write(POD_RES, "DELETED", clone(o), o)
                return gone

            cut_gangs.update(await on_fake(fake, delete_node))
            deleted_nodes.append(name)
            node_kills += 1
        # The leader dies without a word; a fresh replica starts in its place.
        if now >= next_kill and now < started + c.arrival_s + 5:
            next_kill = now + c.kill_every
            leader = next((r for r in replicas if r.elector.leading.is_set()), None)
            if leader is not None:
                await _stop(leader)
                replicas.remove(leader)
                replicas.append(await _start(kubeconfig_, f"r{len(replicas) + kills + 2}", c.lease))
                kills += 1
        if rng.random() < 0.05:
            fake.control("drop-watches")
            drops += 1
        # Done: every pod created, none bound, and either none waiting or none bound for QUIET_S (longer than a
        # leader's take-over and a waiting workload's retry), so what still waits cannot run.
        if created >= c.pods and now > started + c.arrival_s:

            def idle() -> tuple[bool, bool]:
                pods = [o for o in store.objects.values() if o.get("kind") == "Pod"]
                return not any(o["spec"].get("nodeName") for o in pods), not pods

            nothing_bound, nothing_left = await on_fake(fake, idle)
            if not nothing_bound:
                idle_since = None
            elif nothing_left:
                break
            else:
                idle_since = idle_since or now
                if now - idle_since > QUIET_S:
                    break
        await asyncio.sleep(0.1)
    elapsed = time.monotonic() - started
    fake.control("clear-faults")
    for r in replicas:
        await _stop(r)
    await port.close()
    requests = fake.control("requests")["requests"]
    state = fake.control("state")
    result = audit(store, requests, limits, cut_gangs)
    return {
        "seed": c.seed,
        "pods": created,
        "seconds": round(elapsed, 1),
        "finished": elapsed < c.limit_s,
        "violations": result.counts(),
        "examples": {k: v[:3] for k, v in result.__dict__.items() if v},
        "faults": {
            **state["injected"],
            "leader_kills": kills,
            "node_deletions": node_kills,
            "watch_drops": drops,
        },
        "binds": sum(1 for r in requests if r["path"].endswith("/binding") and r["code"] == 201),
    }
