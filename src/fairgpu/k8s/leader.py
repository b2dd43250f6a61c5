"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's rules: a lease is expired when its
record has not changed for leaseDurationSeconds *as this replica observed it* (so clocks need not agree);
take-over and renewal are PUTs with the read resourceVersion, and a 409 means another replica won.

Fencing. A renewal that started at t and succeeded wrote the lease after t, and a standby takes over only
leaseDuration after it saw that write, so no standby acts before t + leaseDuration. This replica acts as
leader only until t + renewDeadline (renewDeadline < leaseDuration; the difference is the margin for a
request sent just before the deadline to land). Each attempt runs under that hard deadline, so a renewal
never waits behind a slow API server's retries, and a timer (not the next attempt) steps down on time.

Its own thread. As client-go's elector runs in a goroutine of its own, this one runs on a thread and event
loop of its own, with a connection of its own: a renewal never waits behind the controller's synchronous
work (a rebuild, a cycle's slice, parsing a large list), which on a starved CPU held the shared loop past
the renew deadline and made leadership flap. The caller's loop learns of each term through `leading`,
`term` and `on_lost`; `remaining()`, which fences every Binding, reads the thread's own deadline, so it is
right from any thread even before that loop has heard of a step-down.

A lease for a live scheduler only. Given the scheduling loop's heartbeat (heartbeat.py), the elector neither
takes nor renews the lease while the loop has not passed within its bound, and steps down at once (it wakes
when the heartbeat goes stale, not at its next attempt). Stopped gracefully, the replica releases the lease
(release_lease, replica.py) so a standby need not wait it out; so does a hung leader's elector, given the
loop's writes (writes.py): the step-down has closed the fence (this thread's deadline, or the shared T of
elector_process.py) before the release is tried, and it is tried only while no write that carries out a
decision is on the wire or was given up within a lease duration (read after the GET, a round trip after the
fence closed), so nothing of the hung loop's lands after a standby took over. A loop that wakes later finds
the fence closed: it acts again only in a new term, which needs a fresh heartbeat and the lease won back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from fairgpu.errors import KubeError
from fairgpu.k8s.heartbeat import Heartbeat
from fairgpu.k8s.port import LEASES, KubePort
from fairgpu.k8s.writes import Writes

log = logging.getLogger(__name__)
JITTER = 1.2  # client-go's JitterFactor: renewDeadline must exceed retryPeriod by this factor
PAST_STALE = 0.01  # seconds: a leader's elector looks this long after its heartbeat would go stale


class Leadership(Protocol):
    """What the controller reads of an elector, on its own loop: `leading` while it leads, `term` counting the
    terms begun, `on_lost` called when a term ends, and `remaining()` (from any thread), which fences every
    Binding: 0 unless the term the loop knows of is held."""

    leading: asyncio.Event
    term: int
    on_lost: list[Callable[[], None]]

    def remaining(self) -> float: ...


def term_ended(leader: Leadership) -> None:
    """The term ends on the caller's loop: stop leading, and tell who listens (once, if it was leading)."""
    if leader.leading.is_set():
        leader.leading.clear()
        for callback in leader.on_lost:
            callback()


def renew_deadline_of(lease_duration: float, renew_deadline: float | None, retry_period: float) -> float:
    """The renew deadline (client-go's default: two thirds of the lease), checked against the other two."""
    renew_deadline = lease_duration * 2 / 3 if renew_deadline is None else renew_deadline
    if not lease_duration > renew_deadline > JITTER * retry_period > 0:
        raise ValueError(
            f"leader election needs leaseDuration ({lease_duration:g}s) > renewDeadline ({renew_deadline:g}s)"
            f" > {JITTER:g} × retryPeriod ({retry_period:g}s)"
        )
    return renew_deadline


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
        publish: Callable[[float, bool], None] | None = None,
        heartbeat: Heartbeat | None = None,
        writes: Writes | None = None,
    ) -> None:
        renew_deadline = renew_deadline_of(lease_duration, renew_deadline, retry_period)
        self.port = port
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.monotonic = monotonic
        # Told, on the election's loop, of each validity: (until, began a term), (0, False) at a step-down,
        # before anything else is done about it (elector_process.py hands it to the scheduler's process).
        self.publish = publish
        # The scheduling loop's: the lease is neither taken nor kept while it is not fresh (heartbeat.py).
        self.heartbeat = heartbeat
        self._hung = False  # told once per spell of a stale heartbeat
        # The loop's writes on the wire: with them, a hung leader hands the lease over (until this monotonic
        # time, after which it has expired anyway; 0 when none is due). Without, it is left to expire.
        self.writes = writes
        self._hand_over_by = 0.0
        # The caller's loop's view, changed only on that loop: set while this replica leads; `term` counts
        # the terms begun (a term lost and won again between two looks at `leading` is a new one).
        self.leading = asyncio.Event()
        self.term = 0
        self.on_lost: list[Callable[[], None]] = []  # called on the caller's loop when this replica stops leading
        # The election thread's own: it writes them, anyone reads them.
        self._observed: tuple[str, float] | None = None  # (record's resourceVersion, when it was first seen)
        self._valid_until = 0.0  # monotonic: this replica acts as leader only before this; 0 when not leading
        self._begun = 0  # terms begun; `remaining()` is 0 until the caller's loop has heard of the latest
        self._expiry: asyncio.TimerHandle | None = None
        self._caller: asyncio.AbstractEventLoop | None = None

    def remaining(self) -> float:
        """Seconds this replica may still act as leader in the term the caller's loop knows of (0 when it does
        not lead). Thread-safe: a term ended and begun again here is not the loop's until it hears of it."""
        if self._begun != self.term:
            return 0.0
        return max(0.0, self._valid_until - self.monotonic())

    async def run(self) -> None:
        """Elect until cancelled, on a thread of its own (see the module's docstring). Returns only when that
        thread has stopped: a stopped replica renews nothing more."""
        caller = self._caller = asyncio.get_running_loop()
        loop = asyncio.new_event_loop()
        election = loop.create_task(self._elect_on_own_port())  # before the thread starts: cancellable at once
        ended: asyncio.Future[BaseException | None] = caller.create_future()

        def thread() -> None:
            outcome: BaseException | None = None
            try:
                loop.run_until_complete(election)
            except BaseException as err:  # its end, whatever it is, is the caller's to see
                outcome = err
            finally:
                loop.close()
            with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
                caller.call_soon_threadsafe(_settle, ended, outcome)

        threading.Thread(target=thread, name=f"lease-{self.identity}", daemon=True).start()
        try:
            outcome = await asyncio.shield(ended)
        finally:
            if not ended.done():  # cancelled: stop the thread (it steps down on its way out) and wait for it
                loop.call_soon_threadsafe(election.cancel)
                await ended
            self._ended()  # whatever the thread's news still on its way, this loop stops leading now
        if outcome is not None and not isinstance(outcome, asyncio.CancelledError):
            raise outcome

    async def release(self, port: KubePort) -> bool:
        """Once run() has ended (its thread renews nothing more): give the lease up (release_lease)."""
        return await release_lease(port, self.namespace, self.name, self.identity)

    async def elect(self) -> None:
        """Elect until cancelled on this loop, with `port` as it is, telling this loop (in a process of the
        election's own: elector_process.py)."""
        self._caller = asyncio.get_running_loop()
        await self._elect(self.port)

    async def _elect(self, port: KubePort) -> None:
        try:
            while True:
                if not self._scheduler_alive():
                    if self._hand_over_by:
                        await self._hand_over(port)
                    await asyncio.sleep(self.retry_period)
                    continue
                started = self.monotonic()
                # A renewal must finish before the current term ends; an acquisition within a renewDeadline.
                deadline = self._valid_until or started + self.renew_deadline
                try:  # asyncio.timeout, not wait_for: in 3.11 wait_for loses a cancellation that meets the answer
                    async with asyncio.timeout(max(0.0, deadline - started)):
                        won = await self.try_acquire_or_renew(port)
                except (KubeError, OSError, TimeoutError) as err:
                    log.warning("lease %s/%s: %r", self.namespace, self.name, err)
                    won = False
                if won and started + self.renew_deadline > self.monotonic():
                    self._extend(started + self.renew_deadline)
                elif self._valid_until and self.monotonic() >= self._valid_until:
                    self._step_down()
                await self._pause()
        finally:
            if self._valid_until:
                self._step_down()

    def _scheduler_alive(self) -> bool:
        """The scheduling loop has passed within the heartbeat's bound; else this replica steps down at once
        (not at its term's end: a hung scheduler gains nothing from the rest of the term) and renews nothing."""
        if self.heartbeat is None or self.heartbeat.fresh():
            self._hung = False
            self._hand_over_by = 0.0
            return True
        age = self.heartbeat.age()
        if age is not None and not self._hung:
            self._hung = True
            log.error(
                "%s: the scheduling loop has not passed for %.1fs (bound %gs): not renewing the lease",
                self.identity,
                age,
                self.heartbeat.stale_after,
            )
        if self._valid_until:
            self._step_down()  # first: the fence closes
            if self.writes is not None:
                self._hand_over_by = self.monotonic() + self.lease_duration
        return False

    async def _pause(self) -> None:
        """A retry period between attempts. A leader's heartbeat that goes stale meanwhile wakes it then: its
        step-down and hand-over do not wait for the next attempt."""
        pause, beat = self.retry_period, self.heartbeat
        left = beat.stale_in() if beat is not None and self._valid_until else None
        if beat is not None and left is not None and left < pause:
            await asyncio.sleep(max(0.0, left) + PAST_STALE)
            if beat.stale():
                return
            pause -= left
        await asyncio.sleep(pause)

    async def _hand_over(self, port: KubePort) -> None:
        """The hung leader's release (see the module's docstring), tried at each look until it is done or the
        lease would have expired anyway."""
        writes, duration = self.writes, self.lease_duration
        if writes is None or self.monotonic() >= self._hand_over_by:
            self._hand_over_by = 0.0
            return
        try:
            async with asyncio.timeout(self.renew_deadline):
                released = await release_lease(
                    port, self.namespace, self.name, self.identity, lambda: writes.quiet(duration)
                )
        except (KubeError, OSError, TimeoutError) as err:
            log.warning("lease %s/%s not released: %r", self.namespace, self.name, err)
            return
        if released:
            self._hand_over_by = 0.0

    async def _elect_on_own_port(self) -> None:
        port = await self.port.reconnect()  # this loop's own: a session belongs to the loop it was made on
        try:
            await self._elect(port)
        finally:
            await port.close()

    def _extend(self, until: float) -> None:
        began = not self._valid_until
        self._begun += began
        self._valid_until = until
        if self.publish is not None:
            self.publish(until, began)
        if self._expiry is not None:
            self._expiry.cancel()
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_at(loop.time() + (until - self.monotonic()), self._expired)
        if began:
            log.info("%s became the leader", self.identity)
            self._tell(self._began)

    def _expired(self) -> None:
        self._expiry = None
        if self._valid_until and self.monotonic() >= self._valid_until:
            log.warning("%s could not renew its lease in time and steps down", self.identity)
            self._step_down()

    def _step_down(self) -> None:
        if self.publish is not None:  # first: the scheduler stops binding before anything else happens
            self.publish(0.0, False)
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._valid_until = 0.0
        self._tell(self._ended)

    def _tell(self, news: Callable[[], None]) -> None:
        """Hand news of a term to the caller's loop (in order: a step-down before the next term's start)."""
        assert self._caller is not None
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is left to tell
            self._caller.call_soon_threadsafe(news)

    def _began(self) -> None:
        self.term += 1
        self.leading.set()

    def _ended(self) -> None:
        term_ended(self)

    async def try_acquire_or_renew(self, port: KubePort | None = None) -> bool:
        """One attempt, on `port` (the elector's own by default)."""
        port = self.port if port is None else port
        now = datetime.now(UTC)
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": microtime(now),
            "renewTime": microtime(now),
            "leaseTransitions": 0,
        }
        try:
            lease = await port.get(LEASES, self.name, self.namespace)
        except KubeError as err:
            if err.code != 404:
                raise
            try:
                await port.create(LEASES, {"metadata": {"name": self.name}, "spec": spec}, self.namespace)
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
            await port.replace(LEASES, self.name, body, self.namespace)
        except KubeError as err:
            if err.code == 409:
                return False
            raise
        return True


async def release_lease(
    port: KubePort, namespace: str, name: str, identity: str, quiet: Callable[[], bool] = lambda: True
) -> bool:
    """Give up the lease at once, as client-go's ReleaseOnCancel does: the record is updated to no holder and
    a one-second duration, so a standby takes it at its next attempt instead of a lease duration later. Only
    a record that names `identity`, and only the version read (its resourceVersion): a record another replica
    wrote meanwhile is never overwritten (409). Call it only once this replica neither renews the lease nor
    lets a write it guards pass; `quiet()`, asked after the read, says nothing of it is under way. True if the
    lease was released."""
    try:
        lease = await port.get(LEASES, name, namespace)
    except KubeError as err:
        if err.code != 404:  # none: nothing to release
            log.warning("lease %s/%s not released: %s", namespace, name, err)
        return False
    held = lease.get("spec") or {}
    if held.get("holderIdentity") != identity:
        return False
    if not quiet():
        log.info("lease %s/%s not released yet: a write of %s may still land", namespace, name, identity)
        return False
    now = microtime(datetime.now(UTC))
    spec = {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": now,
        "renewTime": now,
        "leaseTransitions": held.get("leaseTransitions", 0),
    }
    meta = {"name": name, "namespace": namespace, "resourceVersion": lease["metadata"]["resourceVersion"]}
    try:
        await port.replace(LEASES, name, {"metadata": meta, "spec": spec}, namespace)
    except KubeError as err:  # 409: another replica wrote it meanwhile, and keeps it
        log.warning("lease %s/%s not released: %s", namespace, name, err)
        return False
    log.info("%s released the lease %s/%s", identity, namespace, name)
    return True


def _settle(future: asyncio.Future[BaseException | None], outcome: BaseException | None) -> None:
    if not future.done():
        future.set_result(outcome)
