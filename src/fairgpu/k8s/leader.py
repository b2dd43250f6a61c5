"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules: a lease is expired when its
record has not changed for leaseDurationSeconds *as this replica observed it* (so clocks need not agree);
take-over and renewal are PUTs with the read resourceVersion, and a 409 means another replica won."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from fairgpu.errors import KubeError
from fairgpu.k8s.port import LEASES, KubePort

log = logging.getLogger(__name__)


def microtime(when: datetime) -> str:
    """MicroTime with exactly six fractional digits; the apiserver rejects anything else."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        port: KubePort,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        retry_period: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.port = port
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.retry_period = retry_period
        self.monotonic = monotonic
        self.leading = asyncio.Event()
        self._observed: tuple[str, float] | None = None  # (record's resourceVersion, when it was first seen)
        self._renewed_at = 0.0

    async def run(self) -> None:
        while True:
            try:
                won = await self.try_acquire_or_renew()
            except (KubeError, OSError) as err:
                log.warning("lease %s/%s: %s", self.namespace, self.name, err)
                won = False
            now = self.monotonic()
            if won:
                self._renewed_at = now
                if not self.leading.is_set():
                    log.info("%s became the leader", self.identity)
                self.leading.set()
            elif self.leading.is_set() and now - self._renewed_at >= self.lease_duration * 2 / 3:
                log.warning("%s could not renew its lease in time and steps down", self.identity)
                self.leading.clear()
            await asyncio.sleep(self.retry_period)

    async def try_acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": microtime(now),
            "renewTime": microtime(now),
            "leaseTransitions": 0,
        }
        try:
            lease = await self.port.get(LEASES, self.name, self.namespace)
        except KubeError as err:
            if err.code != 404:
                raise
            try:
                await self.port.create(LEASES, {"metadata": {"name": self.name}, "spec": spec}, self.namespace)
                return True
            except KubeError as lost:
                if lost.code == 409:
                    return False
                raise
        meta, held = lease["metadata"], lease.get("spec") or {}
        rv = meta["resourceVersion"]
        if self._observed is None or self._observed[0] != rv:
            self._observed = (rv, self.monotonic())
        mine = held.get("holderIdentity") == self.identity
        expired = self.monotonic() - self._observed[1] >= held.get("leaseDurationSeconds", self.lease_duration)
        if not mine and held.get("holderIdentity") and not expired:
            return False
        if mine:
            spec["acquireTime"] = held.get("acquireTime", spec["acquireTime"])
            spec["leaseTransitions"] = held.get("leaseTransitions", 0)
        else:
            spec["leaseTransitions"] = held.get("leaseTransitions", 0) + 1
        body = {"metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": rv}, "spec": spec}
        try:
            await self.port.replace(LEASES, self.name, body, self.namespace)
        except KubeError as err:
            if err.code == 409:
                return False
            raise
        return True
