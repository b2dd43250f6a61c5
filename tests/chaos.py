"""A chaos soak of the live scheduler (issue 11, item 8), audited by tests/audit.py.

Two or more controller replicas with leader election run against the wire-level fake while it answers
random 5xx, 409 and 429, loses answers of committed writes, drops watches, and while leaders are killed,
nodes deleted (their pods collected, as the pod GC does) and fairgpu's admission webhook restarted. Pods of
several tenants arrive over time through the API and its webhooks (whole GPUs, fractions, gangs); a pod
refused while the webhook is down is created again later, as a Job controller would. Pods run for a while
and finish. The run is bounded in time whatever happens: a replica that does not stop when cancelled is
reported (stuck_replicas), never waited for.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from audit import GROUP, MIN, REGISTER, Audit, audit, end_state
from chaos_webhook import POD_WEBHOOKS, ChaosWebhook
from fairgpu.catalog import load_profile
from fairgpu.errors import KubeError
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.elector_process import ElectorProcess
from fairgpu.k8s.heartbeat import Heartbeat
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.port import NODES, PODS, QUEUES, Kind
from fairgpu.k8s.writes import Writes
from fakeapi.server import _BY_PATH, FakeApi, FakeEndpoint
from fakeapi.store import clone

T = TypeVar("T")
QUIET_S = 10.0
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


# -- the run --------------------------------------------------------------------------------------------
STOP_S = 5.0  # a cancelled replica has stopped within this long, or is reported stuck
RETRY_S = 0.5  # a pod refused while the webhook is down is created again after this long
SETTLE_S = 30.0  # after the run, without faults, the replicas finish what is under way for at most this long
ELECT_S = 60.0  # the first election takes at most this long
AUDIT_S = 600.0  # the auditor replays millions of writes after a long soak


@dataclass
class Replica:
    ident: str
    port: KubeClient
    elector: LeaderElector | ElectorProcess
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
    elector_process: bool = False  # the elector in a process of its own (k8s/elector_process.py), not a thread
    kill_every: float = 8.0  # a leader is killed this often
    node_deletions: int = 2
    webhook_restarts: int = 2
    webhook_down_s: tuple[float, float] = (0.5, 2.0)
    fault_rate: float = 0.02


@dataclass
class Arrival:
    """One workload's pods on their way in: those not created yet, and when to try them again."""

    tenant: str
    pods: list[dict]
    keys: list[str]
    retry_at: float = 0.0


async def _start(kubeconfig: str, ident: str, lease: tuple[float, float, float], in_process: bool) -> Replica:
    port = await KubeClient.connect(kubeconfig)
    port.api.user_agent = f"fairgpu/{ident}"
    duration, renew, retry = lease
    # As `fairgpu run` wires them: a replica whose loop hangs gives up the lease, handed over once its writes
    # (k8s/writes.py) cannot land any more.
    beat, writes = Heartbeat(), Writes()
    elector: LeaderElector | ElectorProcess = (
        ElectorProcess(
            kubeconfig, LEASE_NAMESPACE, "fairgpu", ident, duration, retry, renew, f"fairgpu/{ident}", beat, writes
        )
        if in_process
        else LeaderElector(
            port, LEASE_NAMESPACE, "fairgpu", ident, duration, retry, renew, heartbeat=beat, writes=writes
        )
    )
    ctl = Controller(port, load_profile("fairgpu"), leadership=elector, heartbeat=beat, writes=writes)
    ctl.retry_every = 0.5
    tasks = [asyncio.create_task(elector.run()), asyncio.create_task(ctl.run())]
    return Replica(ident, port, elector, ctl, tasks)


async def _stop(r: Replica, stuck: list[str]) -> None:
    """Cancel a replica's tasks. One still running STOP_S later is a violation (a stopped controller that runs
    on may bind without the lease): it is reported with where it waits, then cancelled again, a bounded
    number of times, and left behind if it still runs."""
    for t in r.tasks:
        t.cancel()
    _, pending = await asyncio.wait(r.tasks, timeout=STOP_S)
    for t in pending:
        frames = t.get_stack()
        where = f"{frames[-1].f_code.co_filename}:{frames[-1].f_lineno}" if frames else "?"
        stuck.append(f"{r.ident}: {t.get_coro().__qualname__} ran on after its cancellation, at {where}")
    for _ in range(20):
        if not pending:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)
    await r.port.close()


def _inject(fake: FakeEndpoint, c: Chaos) -> None:
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


async def on_fake(fake: FakeEndpoint, fn: Callable[..., T], *args: object, timeout: float = 10.0) -> T:
    """fn(FakeApi, *args) on the fake's own loop (its store is not thread-safe), in the fake's process (a
    module-level fn, then), without blocking this loop meanwhile."""
    return await asyncio.to_thread(fake.apply, fn, *args, timeout=timeout)


# -- on the fake's loop, in its process -------------------------------------------------------------------
def _pod(api: FakeApi, key: str) -> dict | None:
    return api.store.objects.get(("", "pods", *key.split("/", 1)))


def workload_states(api: FakeApi, workloads: list[list[str]]) -> list[tuple[int, bool]]:
    """Per workload (its pod keys): how many of its pods are left, and whether all of those run."""
    out = []
    for keys in workloads:
        live = [o for o in (_pod(api, k) for k in keys) if o is not None]
        out.append((len(live), all((o.get("status") or {}).get("phase") == "Running" for o in live)))
    return out


def finish(api: FakeApi, workloads: list[list[str]]) -> None:
    """These workloads' pods are deleted at once, as are pods an eviction or a rolled back gang marked for
    deletion."""
    store = api.store
    for keys in workloads:
        for o in [o for o in (_pod(api, k) for k in keys) if o is not None]:
            store._write(POD_RES, "DELETED", clone(o), o)
    marked = [o for o in store.objects.values() if o.get("kind") == "Pod" and o["metadata"].get("deletionTimestamp")]
    for o in marked:
        store._write(POD_RES, "DELETED", clone(o), o)


def delete_node(api: FakeApi, name: str) -> list[str]:
    """A node goes, and the pods bound to it with it (pod GC). The gangs cut that way."""
    gone: list[str] = []
    store = api.store
    obj = store.objects.get(("", "nodes", "", name))
    if obj is None:
        return gone
    store._write(NODE_RES, "DELETED", clone(obj), obj)
    for o in [o for (g, p, *_), o in store.objects.items() if p == "pods" and o["spec"].get("nodeName") == name]:
        labels = o["metadata"].get("labels") or {}
        if GROUP in labels:
            gone.append(f"{o['metadata']['namespace']}/{labels[GROUP]}")
        store._write(POD_RES, "DELETED", clone(o), o)
    return gone


def idle(api: FakeApi) -> tuple[bool, bool]:
    """(no pod bound, no pod left)."""
    pods = [o for o in api.store.objects.values() if o.get("kind") == "Pod"]
    return not any(o["spec"].get("nodeName") for o in pods), not pods


def current_end_state(api: FakeApi, cut_gangs: set[str]) -> tuple[list[str], list[str]]:
    return end_state(api.store, cut_gangs)


def keep_history(api: FakeApi) -> None:
    api.store.log = deque(api.store.log, maxlen=5_000_000)  # the auditor replays all of it


def has_namespace(api: FakeApi, ns: str) -> bool:
    return ("", "namespaces", "", ns) in api.store.objects


def audit_run(
    api: FakeApi, limits: dict[str, float], cut_gangs: set[str], tenants: set[str]
) -> tuple[Audit, int, dict]:
    """The auditor over the fake's history, request and admission logs; the Bindings that succeeded; and how
    the lease fared (leadership, not a violation itself, explains a run that binds little)."""
    requests = api.state.faults.log
    result = audit(api.store, requests, limits, cut_gangs, (list(api.admission.calls), POD_WEBHOOKS, tenants))
    return (
        result,
        sum(1 for r in requests if r["path"].endswith("/binding") and r["code"] == 201),
        lease_story(requests),
    )


def lease_story(requests: list[dict]) -> dict:
    """From the request log: lease writes that landed and failed, holders in turn, and the longest time
    between two writes that landed (a leader renews every retry period; a gap past the lease duration is
    time without a leader)."""
    writes = sorted(
        (r for r in requests if "/leases" in r["path"] and r["verb"] in ("PUT", "POST")), key=lambda r: r["t"]
    )
    landed = [r for r in writes if r["code"] < 300]
    holders = [r["agent"] for r in landed]
    terms = sum(1 for i, h in enumerate(holders) if i == 0 or h != holders[i - 1])
    times = [r["t"] for r in landed]
    gap = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
    return {"writes": len(landed), "failed": len(writes) - len(landed), "terms": terms, "longest_gap_s": round(gap, 1)}


class Run:
    """One chaos run: the driver's state and its faults."""

    def __init__(self, fake: FakeEndpoint, kubeconfig: str, c: Chaos, port: KubeClient, hook: ChaosWebhook) -> None:
        self.fake, self.kubeconfig, self.c, self.port, self.hook = fake, kubeconfig, c, port, hook
        self.rng = random.Random(c.seed)
        self.tenants = [f"t{k}" for k in range(c.tenants)]
        self.replicas: list[Replica] = []
        self.stuck: list[str] = []
        self.refused: list[str] = []  # pods the API refused for good (the webhook denied them)
        self.arriving: list[Arrival] = []
        self.workloads: list[list[str]] = []  # pod keys of each workload whose pods are all created
        self.done: set[int] = set()  # workloads none of whose pods are left
        self.run_until: dict[int, float] = {}
        self.cut_gangs: set[str] = set()
        self.generated = self.created = self.workload_count = 0
        self.faults = dict.fromkeys(("leader_kills", "node_deletions", "watch_drops", "webhook_refusals"), 0)
        self.restarting: asyncio.Task | None = None

    async def arrivals(self, now: float, started: float) -> None:
        """New workloads, spread over arrival_s, and those refused earlier, created through the API."""
        c = self.c
        due = int(min(1.0, (now - started) / c.arrival_s) * c.pods)
        while self.generated < due:
            tenant = self.rng.choice(self.tenants)
            pods = workload(self.rng, tenant, self.workload_count)
            self.workload_count += 1
            self.generated += len(pods)
            self.arriving.append(Arrival(tenant, pods, [f"{tenant}/{p['metadata']['name']}" for p in pods]))
        ready = [a for a in self.arriving if a.retry_at <= now]
        await asyncio.gather(*(self._create(a, now) for a in ready))
        for a in ready:
            if not a.pods:
                self.arriving.remove(a)
                self.workloads.append(a.keys)

    async def _create(self, a: Arrival, now: float) -> None:
        results = await asyncio.gather(*(self.port.create(PODS, p, a.tenant) for p in a.pods), return_exceptions=True)
        left = []
        for pod, result in zip(a.pods, results, strict=True):
            key = f"{a.tenant}/{pod['metadata']['name']}"
            if isinstance(result, KubeError) and result.code >= 500:  # the webhook unreachable: failurePolicy Fail
                left.append(pod)
                self.faults["webhook_refusals"] += 1
            elif isinstance(result, BaseException):
                self.refused.append(f"{key}: {result}")
                a.keys.remove(key)
            else:
                self.created += 1
        a.pods, a.retry_at = left, now + RETRY_S

    async def housekeeping(self) -> None:
        """Workloads that have run long enough finish (all their pods deleted at once), as do pods the eviction
        of a victim or a rolled back gang marked for deletion."""
        open_ = [w for w in range(len(self.workloads)) if w not in self.done]
        states = await on_fake(self.fake, workload_states, [self.workloads[w] for w in open_])
        t, due = time.monotonic(), []
        for w, (live, running) in zip(open_, states, strict=True):
            if not live:
                self.done.add(w)
                continue
            # A workload that lost a pod (its node went, or its gang was rolled back) fails as a Job would.
            cut = live < len(self.workloads[w])
            if cut or running:
                self.run_until.setdefault(w, t + (0.0 if cut else self.rng.uniform(*self.c.run_s)))
            if self.run_until.get(w, float("inf")) <= t:
                due.append(self.workloads[w])
        await on_fake(self.fake, finish, due)

    async def kill_leader(self) -> None:
        """The leader dies without a word; a fresh replica starts in its place."""
        leader = next((r for r in self.replicas if r.elector.leading.is_set()), None)
        if leader is None:
            return
        await _stop(leader, self.stuck)
        self.replicas.remove(leader)
        self.faults["leader_kills"] += 1
        ident = f"r{len(self.replicas) + self.faults['leader_kills'] + 1}"
        self.replicas.append(await _start(self.kubeconfig, ident, self.c.lease, self.c.elector_process))

    async def drive(self) -> float:
        """The run until everything finished or cannot run, or until limit_s; its length in seconds."""
        c, rng = self.c, self.rng
        self.replicas = [await _start(self.kubeconfig, f"r{i}", c.lease, c.elector_process) for i in range(2)]
        # The run's clock starts once a replica leads: the electors' processes start slowly on a loaded machine.
        end = time.monotonic() + ELECT_S
        while not any(r.elector.leading.is_set() for r in self.replicas) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        started = time.monotonic()
        next_kill = started + c.kill_every
        node_times = sorted(started + rng.uniform(0.2, 0.8) * c.arrival_s for _ in range(c.node_deletions))
        hook_times = sorted(started + rng.uniform(0.1, 0.8) * c.arrival_s for _ in range(c.webhook_restarts))
        idle_since: float | None = None
        while (now := time.monotonic()) < started + c.limit_s:
            await self.arrivals(now, started)
            await self.housekeeping()
            if node_times and now >= node_times[0]:
                node_times.pop(0)
                name = f"node-{rng.randrange(c.nodes):03d}"
                self.cut_gangs.update(await on_fake(self.fake, delete_node, name))
                self.faults["node_deletions"] += 1
            if hook_times and now >= hook_times[0] and (self.restarting is None or self.restarting.done()):
                hook_times.pop(0)
                self.restarting = asyncio.create_task(self.hook.restart(rng.uniform(*c.webhook_down_s)))
            if now >= next_kill and now < started + c.arrival_s + 5:
                next_kill = now + c.kill_every
                await self.kill_leader()
            if rng.random() < 0.05:
                self.fake.control("drop-watches")
                self.faults["watch_drops"] += 1
            # Done: every pod created, and either none left or none bound for QUIET_S (longer than a leader's
            # take-over and a waiting workload's retry), so what still waits cannot run.
            if self.generated >= c.pods and not self.arriving and now > started + c.arrival_s:
                nothing_bound, nothing_left = await on_fake(self.fake, idle)
                if not nothing_bound:
                    idle_since = None
                elif nothing_left:
                    break
                else:
                    idle_since = idle_since or now
                    if now - idle_since > QUIET_S:
                        break
            await asyncio.sleep(0.1)
        return time.monotonic() - started

    async def settle(self) -> None:
        """Arrivals and faults stop, and the replicas get up to SETTLE_S to finish what is under way (a gang is
        bound member by member; a new pod waits for its first explanation) before the end state is judged, as
        a run cut at its limit may be caught mid-way. What is still wrong after that is a violation."""
        self.fake.control("clear-faults")
        end = time.monotonic() + SETTLE_S
        while time.monotonic() < end:
            lost, partial = await on_fake(self.fake, current_end_state, self.cut_gangs)
            if not lost and not partial:
                return
            await asyncio.sleep(0.5)

    async def teardown(self) -> None:
        for r in self.replicas:
            await _stop(r, self.stuck)
        if self.restarting is not None:
            await asyncio.wait({self.restarting}, timeout=STOP_S + 10)


async def run_chaos(fake: FakeEndpoint, kubeconfig: str, c: Chaos) -> dict:
    """One run against `fake`: best a FakeProcess, so that a starved driver process cannot make the fake
    answer late (the run measures the scheduler)."""
    await on_fake(fake, keep_history)
    fake.control("device-plugin")
    port = await KubeClient.connect(kubeconfig)  # the driver's own client: no faults
    port.api.user_agent = "chaos-driver"
    for i in range(c.nodes):
        await port.create(NODES, chaos_node(i, c.gpus))
    tenants = [f"t{k}" for k in range(c.tenants)]
    # The fake, like a real apiserver, creates nothing in a namespace that does not exist: the tenants' and the
    # Lease's namespaces come first (a fake started by the tests' fixture has some of them already).
    for ns in (*tenants, LEASE_NAMESPACE):
        if not await on_fake(fake, has_namespace, ns):
            await port.create(NAMESPACE, {"metadata": {"name": ns}})
    limits = {tenants[0]: float(c.gpus * 2)}  # one tenant is capped
    queues: dict[str, tuple[str, ...]] = {}
    for k, t in enumerate(tenants):
        spec: dict = {"namespaces": [t], "weight": 1 + k % 2}
        if t in limits:
            spec["limit"] = {"nvidia.com/gpu": str(int(limits[t]))}
        await port.create(QUEUES, {"metadata": {"name": f"q-{t}"}, "spec": spec})
        queues[f"q-{t}"] = (t,)
    hook = await asyncio.to_thread(ChaosWebhook, Path(kubeconfig).parent, queues)
    await hook.register(fake, port)
    _inject(fake, c)
    run = Run(fake, kubeconfig, c, port, hook)
    elapsed, finished = c.limit_s, False
    try:
        try:  # the loop bounds itself; this bounds an await inside it that would not end
            async with asyncio.timeout(c.limit_s + 30):
                elapsed = await run.drive()
                finished = elapsed < c.limit_s
        except TimeoutError:
            run.stuck.append("the driver's loop overran its limit by 30 s")
        await run.settle()
    finally:
        await run.teardown()
        await asyncio.to_thread(hook.stop)
        await port.close()
    state = fake.control("state")
    result, binds, lease = await on_fake(fake, audit_run, limits, run.cut_gangs, set(tenants), timeout=AUDIT_S)
    result.stuck_replicas += run.stuck
    result.lost_pods += run.refused
    return {
        "seed": c.seed,
        "pods": run.created,
        "seconds": round(elapsed, 1),
        "finished": finished,
        "violations": result.counts(),
        "examples": {k: v[:3] for k, v in result.__dict__.items() if v},
        "faults": {**state["injected"], **run.faults, "webhook_restarts": hook.restarts},
        "binds": binds,
        "lease": lease,
    }
