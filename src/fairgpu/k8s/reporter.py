"""What users see of the scheduler's decisions: Kubernetes Events on pods, the PodScheduled=False condition
with the engine's explanation, and queue status conditions. Writes run in the background, deduplicated
(the same message is not repeated) and rate-limited per pod, so a slow API server never stalls a cycle.
Events are counted, aggregated and rate-limited as client-go's recorder does (events.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from datetime import UTC, datetime

import numpy as np

from fairgpu import resources as r
from fairgpu.errors import KubeError
from fairgpu.framework.explain import queue_places
from fairgpu.framework.scheduler import Scheduler
from fairgpu.k8s.events import EventRecorder
from fairgpu.k8s.identity import USER_ANNOTATION
from fairgpu.k8s.port import PODS, QUEUES, KubePort
from fairgpu.k8s.queues import EXCLUSIVE, SHADOWED, QueueMap

log = logging.getLogger(__name__)
# A condition write that failed is tried again this often, backing off, while its message is still the pod's
# latest: unchanged messages are not posted again, so without this a pod whose one write met a 5xx or a
# conflict kept no reason at all for as long as its reason stayed the same.
CONDITION_TRIES = 5
CONDITION_BACKOFF = 0.5  # seconds before the first retry, doubling
QUEUE_KIND = f"{QUEUES.group}/{QUEUES.version}/Queue"  # an Event's involved object


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reporter:
    def __init__(
        self,
        port: KubePort,
        component: str,
        explain_every: float = 10.0,
        concurrency: int = 8,
        pod_cache: Callable[[str], dict | None] = lambda key: None,
    ) -> None:
        self.port = port
        self.pod_cache = pod_cache  # the pod as last seen: a condition is written on condition it is still that
        self.component = component
        self.explain_every = explain_every
        self.last: dict[str, str] = {}  # pod key → last message posted
        self.explained_at: dict[str, float] = {}
        self.told: set[str] = set()  # pods given the quick first reason, their full explanation still to come
        self.queue_last: dict[str, dict] = {}
        self.shadowed: dict[str, str] = {}  # queue → why an older queue serves some of its namespaces
        self._slots = asyncio.Semaphore(concurrency)
        self.events = EventRecorder(port, component)
        self._tasks: set[asyncio.Task] = set()

    def wants_explanation(self, key: str, now: float) -> bool:
        if now - self.explained_at.get(key, -1e18) < self.explain_every:
            return False
        self.explained_at[key] = now
        return True

    def unschedulable(self, key: str, uid: str, message: str) -> None:
        if self.last.get(key) == message:
            return
        self.last[key] = message
        ns, name = key.split("/", 1)
        self._spawn(self._event(ns, name, uid, "FailedScheduling", message, "Warning"))
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        self._spawn(self._condition(key, message, {**condition, "lastTransitionTime": _now()}))

    def unattributed(self, key: str, uid: str, owner: dict) -> None:
        """A pod made from its owner's template that carries no user (webhook.stamp): it waits, saying why and
        how to fix it, and its owner (an ownerReference) is told once."""
        ns = key.split("/", 1)[0]
        kind, name = owner.get("kind") or "owner", owner.get("name") or "?"
        fix = f"delete and re-create {kind} {ns}/{name} (kubectl replace --force -f <its manifest>) now that it is up"
        self.unschedulable(
            key,
            uid,
            f"unattributed: its owner {kind} {ns}/{name} was created while fairgpu's admission webhook was down, so"
            f" its pod template carries no user ({USER_ANNOTATION}) and this pod cannot be charged to anyone; {fix}",
        )
        message = (
            f"its pods cannot be charged to a user and wait: it was created while fairgpu's admission webhook was"
            f" down, so its pod template carries no {USER_ANNOTATION}; {fix}"
        )
        if owner.get("name") and self.last.get(f"owner/{ns}/{kind}/{name}") != message:
            self.last[f"owner/{ns}/{kind}/{name}"] = message
            involved = f"{owner.get('apiVersion', 'v1')}/{kind}"
            self._spawn(self._event(ns, name, owner.get("uid", ""), "Unattributed", message, "Warning", involved))

    def scheduled(self, key: str, uid: str, node: str) -> None:
        self.last.pop(key, None)
        self.explained_at.pop(key, None)
        self.told.discard(key)
        ns, name = key.split("/", 1)
        self._spawn(self._event(ns, name, uid, "Scheduled", f"Successfully assigned {key} to {node}", "Normal"))

    def preempted(self, key: str, reason: str) -> None:
        ns, name = key.split("/", 1)
        self._spawn(self._event(ns, name, "", "Preempted", reason, "Normal"))

    def allocation_unreadable(self, key: str, uid: str, message: str) -> None:
        """A bound pod whose HAMi record cannot be read (or does not fit): its cards count as fully used."""
        ns, name = key.split("/", 1)
        self._spawn(self._event(ns, name, uid, "HAMiAllocationUnaccounted", message, "Warning"))

    def gpus_refused(self, node: str, message: str) -> None:
        """Some of a node's GPUs are left out of scheduling (MIG mode), said once per change."""
        if self.last.get(f"node/{node}") == message:
            return
        self.last[f"node/{node}"] = message
        self._spawn(self._event("default", node, "", "GPUsNotScheduled", message, "Warning", "Node"))

    def trust_news(self, configmap: tuple[str, str], problem: bool, message: str) -> None:
        """A reload of the mounted trusted-identities list, as an Event on its ConfigMap (`kubectl describe
        configmap`): a Warning naming the file and what is wrong with it, or whom it now trusts."""
        ns, name = configmap
        reason, kind = ("TrustedIdentitiesInvalid", "Warning") if problem else ("TrustedIdentitiesReloaded", "Normal")
        self._spawn(self._event(ns, name, "", reason, message, kind, "ConfigMap"))

    async def queue_invalid(self, name: str, problem: str) -> None:
        condition = {"type": "Valid", "status": "False", "reason": "InvalidSpec", "message": problem}
        try:
            await self.port.patch(QUEUES, name, {"status": {"conditions": [condition]}}, subresource="status")
        except KubeError as err:
            log.warning("queue %s is invalid (%s) and its status could not be set: %s", name, problem, err)

    def queues_shadowed(self, queues: QueueMap, uid: Callable[[str], str]) -> None:
        """Queues some of whose namespaces an older queue serves (queues.queue_map): a Warning Event on each,
        and a NamespacesExclusive=False condition in its status for as long as the conflict lasts. Written at
        once when that changes: a change of namespaces alone makes no cycle, so no status write."""
        shadowed = queues.shadowed
        before, self.shadowed = self.shadowed, dict(shadowed)
        for name in before.keys() | shadowed.keys():
            message = shadowed.get(name)
            if before.get(name) == message or name not in queues.allowed:
                continue  # unchanged, or gone or invalid (queue_invalid writes its conditions)
            if message is not None:
                self._spawn(self._event("default", name, uid(name), SHADOWED, message, "Warning", QUEUE_KIND))
            self._spawn(self._queue_status(name, {"conditions": self._queue_conditions(name)}))

    def queue_status(self, name: str, status: dict) -> None:
        """Publish a queue's usage, fair share and counts; unchanged status is not written again."""
        if self.queue_last.get(name) == status:
            return
        self.queue_last[name] = status
        self._spawn(self._queue_status(name, status))

    async def _queue_status(self, name: str, status: dict) -> None:
        async with self._slots:
            try:
                await self.port.patch(QUEUES, name, {"status": status}, subresource="status")
            except KubeError as err:
                log.info("status of queue %s not written: %s", name, err)

    def report_queues(self, engine: Scheduler) -> None:
        """Each valid queue's usage and fair share (engine view, fair dimensions) and its workload counts."""
        view, tree = engine.view, engine.tree
        pending, admitted = engine.workload_counts()
        for q, spec in enumerate(tree.queues):
            self.queue_status(
                spec.name,
                {
                    "usage": _vector(view.usage[q]),
                    "fairShare": _vector(view.entitled[q]),
                    "pending": int(pending[q]),
                    "admitted": int(admitted[q]),
                    "conditions": self._queue_conditions(spec.name),
                },
            )

    def _queue_conditions(self, name: str) -> list[dict]:
        """All of a valid queue's conditions: a status write replaces the list whole."""
        out = [{"type": "Valid", "status": "True", "reason": "Accepted", "message": ""}]
        if name in self.shadowed:
            out.append({"type": EXCLUSIVE, "status": "False", "reason": SHADOWED, "message": self.shadowed[name]})
        return out

    def report_pending(
        self,
        engine: Scheduler,
        members: Callable[[str], tuple[str, ...]],
        waiting: Callable[[str], bool],
        uid: Callable[[str], str | None],
        now: float,
    ) -> Iterator[None]:
        """Why each pending workload waits, on its waiting pods (at most every `explain_every` seconds). It
        yields after each explanation (each costs a replay of the queue ahead): its caller frees the event loop
        between them and may stop at any yield, the workloads not reached being explained at a later pass."""
        names = [w.name for w in engine.workloads("pending")]
        # Those never explained first: in plain submission order, the oldest were explained again whenever
        # due, and with more pending than a pass's budget covers, the newest never got a reason at all.
        names.sort(key=lambda name: any(k in self.explained_at for k in members(name)))
        self._tell_places(engine, names, members, waiting, uid)
        for name in names:
            pending = [k for k in members(name) if waiting(k) and engine.state.placement(k) is None]
            if not pending or not self.wants_explanation(pending[0], now):
                continue
            message = "; ".join(engine.explain(name, now).lines())
            for key in pending:
                pod_uid = uid(key)
                if pod_uid is not None:
                    self.unschedulable(key, pod_uid, message)
            yield

    def _tell_places(
        self,
        engine: Scheduler,
        names: list[str],
        members: Callable[[str], tuple[str, ...]],
        waiting: Callable[[str], bool],
        uid: Callable[[str], str | None],
    ) -> None:
        """Pods never told anything get their queue and place in it at once: full explanations are rationed
        (each replays the queue ahead), and on a starved CPU with hundreds waiting a pod could wait minutes
        for its first one with no reason shown at all."""
        new = [n for n in names if not any(k in self.explained_at or k in self.told for k in members(n))]
        if not new:
            return
        places = queue_places(engine)
        for name in new:
            if name not in places:
                continue
            queue, at, of = places[name]
            message = f"workload {name} (queue {queue}): pending, {at} of {of} in its queue; a full explanation follows"
            for key in members(name):
                pod_uid = uid(key)
                if pod_uid is not None and waiting(key) and engine.state.placement(key) is None:
                    self.told.add(key)
                    self.unschedulable(key, pod_uid, message)

    async def close(self) -> None:
        """Drop the writes still queued: they are best effort, and the client is about to close."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _event(
        self, ns: str, name: str, uid: str, reason: str, message: str, kind: str, involved: str = "Pod"
    ) -> None:
        observed = self.events.observe(ns, name, uid, reason, message, kind, involved)
        if observed is None:
            return
        async with self._slots:
            await self.events.write(*observed)

    async def _condition(self, key: str, message: str, condition: dict) -> None:
        ns, name = key.split("/", 1)
        for attempt in range(CONDITION_TRIES):
            async with self._slots:  # checked once a slot is ours: the wait for one may outlast the reason
                if self.last.get(key) != message:
                    return  # superseded (a newer reason, or the pod was scheduled): that write is what counts
                # A merge patch replaces the whole list, so it carries the pod's other conditions as last seen and
                # that version as a precondition: a write that lands after the pod was bound (and the kubelet
                # marked it Ready) is refused (409), never wiping a running pod's conditions.
                cached = self.pod_cache(key)
                if cached is not None and (cached.get("spec") or {}).get("nodeName"):
                    return  # bound meanwhile: PodScheduled is the Binding's
                body: dict = {"status": {"conditions": [condition]}}
                if cached is not None and cached["metadata"].get("resourceVersion"):
                    others = (cached.get("status") or {}).get("conditions") or []
                    body["status"]["conditions"] = [c for c in others if c.get("type") != condition["type"]] + [
                        condition
                    ]
                    body["metadata"] = {"resourceVersion": cached["metadata"]["resourceVersion"]}
                try:
                    await self.port.patch(PODS, name, body, ns, subresource="status")
                    return
                except KubeError as err:
                    if err.code == 404:
                        return  # the pod is gone
                    log.info("condition for %s not set (attempt %d): %s", key, attempt + 1, err)
            await asyncio.sleep(CONDITION_BACKOFF * 2**attempt)
        if self.last.get(key) == message:
            del self.last[key]  # posted again at the pod's next explanation


def _vector(v: np.ndarray) -> dict[str, str]:
    """A fair vector (gpu, gpumem MiB, cpu millicores, memory MiB) as Kubernetes quantities."""
    gpu, gpumem, cpu, mem = (float(x) for x in v)
    return {r.GPU: f"{gpu:.2f}", r.GPUMEM: f"{int(gpumem)}Mi", r.CPU: f"{int(cpu)}m", r.MEMORY: f"{int(mem)}Mi"}
