"""Kubernetes Events the way client-go's recorder writes them (tools/record/events_cache.go): a repeated
event bumps the count of the one already written instead of creating another; more than AGGREGATE_MAX
different messages of one reason on one object within AGGREGATE_WINDOW are combined into a single event;
and each object gets a token bucket (SPAM_BURST events, then one per SPAM_EVERY seconds), so a pod that
fails to schedule for hours does not flood etcd."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from fairgpu.errors import KubeError
from fairgpu.k8s.port import EVENTS, KubePort

log = logging.getLogger(__name__)
AGGREGATE_MAX = 10
AGGREGATE_WINDOW = 600.0
SPAM_BURST = 25
SPAM_EVERY = 300.0
CACHE_SIZE = 4096  # objects and event kinds remembered (least recently used forgotten), as client-go
COMBINED = "(combined from similar events): "
CLUSTER_SCOPED = ("Node", "Queue")  # involved kinds without a namespace (their events go to "default")


@dataclass(slots=True)
class _Similar:
    since: float
    messages: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Written:
    name: str
    first: str  # firstTimestamp
    count: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # a count bump waits for the create it bumps


V = TypeVar("V")


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class _Lru(OrderedDict[object, V]):
    def touch(self, key: object, make: Callable[[], V]) -> V:
        value = self.get(key)
        if value is None:
            value = self[key] = make()
            if len(self) > CACHE_SIZE:
                self.popitem(last=False)
        else:
            self.move_to_end(key)
        return value


def _timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    def __init__(self, port: KubePort, component: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.port = port
        self.component = component
        self.clock = clock
        self.dropped = 0  # events the spam filter refused
        self._similar: _Lru[_Similar] = _Lru()
        self._written: _Lru[_Written] = _Lru()
        self._buckets: _Lru[_Bucket] = _Lru()

    def observe(
        self, ns: str, name: str, uid: str, reason: str, message: str, kind: str, involved: str = "Pod"
    ) -> tuple | None:
        """Decide what to write for one event: None (rate-limited), or the arguments of `write`. `involved`
        is the kind of the object it is about (a Pod, or a Node, whose events are not namespaced)."""
        now = self.clock()
        bucket = self._buckets.touch((involved, ns, name, uid), lambda: _Bucket(SPAM_BURST, now))
        bucket.tokens = min(SPAM_BURST, bucket.tokens + (now - bucket.at) / SPAM_EVERY)
        bucket.at = now
        if bucket.tokens < 1:
            self.dropped += 1
            return None
        bucket.tokens -= 1
        message = message[:1024]
        similar = self._similar.touch((involved, ns, name, uid, kind, reason), lambda: _Similar(now))
        if now - similar.since > AGGREGATE_WINDOW:
            similar.since, similar.messages = now, set()
        similar.messages.add(message)
        key: tuple = (involved, ns, name, uid, kind, reason, message)
        if len(similar.messages) > AGGREGATE_MAX:
            key, message = (involved, ns, name, uid, kind, reason), COMBINED + message
        stamp = _timestamp()
        written = self._written.touch(key, lambda: _Written(f"{name}.{time.time_ns():x}", stamp))
        written.count += 1
        return ns, name, uid, reason, message, kind, written, stamp, involved

    async def write(
        self,
        ns: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        kind: str,
        written: _Written,
        stamp: str,
        involved: str = "Pod",
    ) -> None:
        async with written.lock:
            count = written.count
            try:
                if count > 1:
                    try:
                        patch = {"count": count, "lastTimestamp": stamp, "message": message}
                        await self.port.patch(EVENTS, written.name, patch, ns)
                        return
                    except KubeError as err:
                        if err.code != 404:
                            raise
                api, _, kind_of = involved.rpartition("/")  # "Pod", "Node", or "batch/v1/Job" for other groups
                obj = {"apiVersion": api or "v1", "kind": kind_of, "name": name, "uid": uid}
                if kind_of not in CLUSTER_SCOPED:
                    obj["namespace"] = ns
                body = {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": written.name, "namespace": ns},
                    "involvedObject": obj,
                    "reason": reason,
                    "message": message,
                    "type": kind,
                    "source": {"component": self.component},
                    "reportingComponent": self.component,
                    "firstTimestamp": written.first,
                    "lastTimestamp": stamp,
                    "count": count,
                }
                await self.port.create(EVENTS, body, ns)
            except KubeError as err:
                log.info("event for %s/%s not recorded: %s", ns, name, err)
