"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules: a lease is expired when its
record has not changed for leaseDurationSeconds *as this replica observed it* (so clocks need not agree);
take-over and renewal are PUTs with the read resourceVersion, and a 409 means another replica won.

Fencing. A renewal that started at t and succeeded wrote the lease after t, and a standby takes over only
leaseDuration after it saw that write, so no standby acts before t + leaseDuration. This replica acts as
leader only until t + renewDeadline (renewDeadline < leaseDuration; the difference is the margin for a
request sent just before the deadline to land). Each attempt runs under that hard deadline, so a renewal
never waits behind a slow API server's retries, and a timer (not the next attempt) steps down on time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from fairgpu.errors import KubeError
from fairgpu.k8s.port import LEASES, KubePort

log = logging.getLogger(__name__)
JITTER = 1.2  # client-go's JitterFactor: renewDeadline must exceed retryPeriod by this factor


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
        renew_deadline: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        renew_deadline = lease_duration * 2 / 3 if renew_deadline is None else renew_deadline
        if not lease_duration > renew_deadline > JITTER * retry_period > 0:
            raise ValueError(
                f"leader election needs leaseDuration ({lease_duration:g}s) > renewDeadline ({renew_deadline:g}s)"
                f" > {JITTER:g} × retryPeriod ({retry_period:g}s)"
            )
        self.port = port
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.monotonic = monotonic
        self.leading = asyncio.Event()
        self.on_lost: list[Callable[[], None]] = []  # called the moment this replica stops leading
        self._observed: tuple[str, float] | None = None  # (record's resourceVersion, when it was first seen)
        self._valid_until = 0.0  # monotonic: this replica acts as leader only before this
        self._expiry: asyncio.TimerHandle | None = None

    def remaining(self) -> float:
        """Seconds this replica may still act as leader (0 when it does not lead)."""
        return max(0.0, self._valid_until - self.monotonic()) if self.leading.is_set() else 0.0

    async def run(self) -> None:
        try:
            while True:
                started = self.monotonic()
                # A renewal must finish before the current term ends; an acquisition within a renewDeadline.
                deadline = self._valid_until if self.leading.is_set() else started + self.renew_deadline
                try:  # asyncio.timeout, not wait_for: in 3.11 wait_for loses a cancellation that meets the answer
                    async with asyncio.timeout(max(0.0, deadline - started)):
                        won = await self.try_acquire_or_renew()
                except (KubeError, OSError, TimeoutError) as err:
                    log.warning("lease %s/%s: %r", self.namespace, self.name, err)
                    won = False
                if won:
                    self._extend(started + self.renew_deadline)
                elif self.leading.is_set() and self.monotonic() >= self._valid_until:
                    self._step_down()
                await asyncio.sleep(self.retry_period)
        finally:
            if self.leading.is_set():
                self._step_down()

    def _extend(self, until: float) -> None:
        self._valid_until = until
        if self._expiry is not None:
            self._expiry.cancel()
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_at(loop.time() + (until - self.monotonic()), self._expired)
        if not self.leading.is_set():
            log.info("%s became the leader", self.identity)
            self.leading.set()

    def _expired(self) -> None:
        self._expiry = None
        if self.leading.is_set() and self.monotonic() >= self._valid_until:
            log.warning("%s could not renew its lease in time and steps down", self.identity)
            self._step_down()

    def _step_down(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._valid_until = 0.0
        self.leading.clear()
        for callback in self.on_lost:
            callback()

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
