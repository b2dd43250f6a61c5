"""Leader election in a process of its own (multiprocessing's forkserver), with its own API client.

Why a process: on a thread, renewals queued behind the scheduler's interpreter lock; on a starved CPU
leadership flapped (gaps of 10-24 s) and some runs never held the lease long enough to bind. A process of
its own is scheduled by the kernel, not behind the scheduler's Python work.

What crosses: two doubles in shared memory, written only by the elector (leader.py's rules): the number of
terms begun, and "held until T" on CLOCK_MONOTONIC (system-wide on Linux, so both processes read the same
clock). T is the renewal's start plus the renew deadline, so the margin to the lease duration covers a
request sent just before T. A step-down writes T = 0 before anything else; a new term counts itself before
it writes its T. `remaining()` reads term, T, term again just before each Binding (carryout.CarryOut.fence):
T from another term than the one this loop knows, or a torn read, counts as not held. An elector that dies
or hangs writes nothing more, so T stops moving and binding stops when it passes: the scheduler never
needs to hear of it to be safe.

The elector exits when the scheduler's process dies (it watches multiprocessing's parent sentinel), and
steps down on SIGTERM. The scheduler restarts a dead elector two lease durations later (one for its lease
to expire, one for a standby to take it: a new elector of the same identity would renew the lease it finds
its own at once), keeping its warm caches and webhook up; it gives up with ElectorDied after MAX_DEATHS deaths
within DEATH_WINDOW lease durations, so a crash-looping elector ends in a pod restart, not in silence.
The elector logs to the scheduler's log stream, at its level and in its format.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import multiprocessing.process
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from fairgpu.errors import ElectorDied
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.heartbeat import Heartbeat
from fairgpu.k8s.leader import LeaderElector, release_lease, renew_deadline_of, term_ended
from fairgpu.k8s.port import KubePort
from fairgpu.k8s.writes import Writes

log = logging.getLogger(__name__)
TERM, UNTIL = 0, 1  # the shared doubles
POLL = 0.05  # seconds between the loop's looks at the shared state (binding does not wait for them)
STOP_S = 2.0  # a stopped elector has exited within this long, or is killed (safe: T is zeroed then)
MAX_DEATHS, DEATH_WINDOW = 3, 10.0  # deaths within this many lease durations end the scheduler
RESTART_AFTER = 2.0  # lease durations
Shared = ctypes.Array[ctypes.c_double]
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    kubeconfig: str | None  # None: the pod's service account
    namespace: str
    name: str
    identity: str
    lease_duration: float
    renew_deadline: float
    retry_period: float
    user_agent: str | None = None


class ElectorProcess:
    """leader.Leadership for the controller, with the elector in a child process (see the module's docstring)."""

    def __init__(
        self,
        kubeconfig: str | None,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        retry_period: float = 2.0,
        renew_deadline: float | None = None,
        user_agent: str | None = None,
        heartbeat: Heartbeat | None = None,
        writes: Writes | None = None,
    ) -> None:
        renew_deadline = renew_deadline_of(lease_duration, renew_deadline, retry_period)
        self.settings = LeaseSettings(
            kubeconfig, namespace, name, identity, lease_duration, renew_deadline, retry_period, user_agent
        )
        self.identity = identity
        self.heartbeat = heartbeat  # the scheduling loop's, in shared memory: the elector reads it (heartbeat.py)
        self.writes = writes  # the loop's writes on the wire, in shared memory: a hung leader's hand-over reads it
        # forkserver: spawn's fresh interpreter (nothing of this threaded process is forked), started once with
        # this module imported; each elector then forks from it ready. Spawned, every elector imported the API
        # client anew: 10 s on a starved CPU, during which a new replica was no standby.
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(["__main__", __name__])
        # Without a lock: a lock the elector held when stopped would stop the scheduler at its next fence. An
        # aligned double is written and read whole; the term is read twice around T to catch a torn pair.
        self._shared = self._ctx.RawArray("d", 2)
        self.leading = asyncio.Event()
        self.term = 0
        self.on_lost: list[Callable[[], None]] = []
        self.process: multiprocessing.process.BaseProcess | None = None

    @property
    def lease_duration(self) -> float:
        return self.settings.lease_duration

    async def release(self, port: KubePort) -> bool:
        """Once run() has ended (the elector process is gone): give the lease up (leader.release_lease)."""
        s = self.settings
        return await release_lease(port, s.namespace, s.name, s.identity)

    def _read(self) -> tuple[int, float]:
        """(term, T), T 0 when the read was torn."""
        term, until, again = self._shared[TERM], self._shared[UNTIL], self._shared[TERM]
        return int(term), until if term == again else 0.0

    def remaining(self) -> float:
        """Seconds this replica may still act as leader in the term its loop knows of; 0 otherwise."""
        term, until = self._read()
        if not self.leading.is_set() or term != self.term:
            return 0.0
        return max(0.0, until - time.monotonic())

    def _look(self) -> None:
        term, until = self._read()
        held = until > time.monotonic()
        if self.leading.is_set() and (not held or term != self.term):
            self._ended()
        if held and not self.leading.is_set():
            self.term = term
            self.leading.set()

    def _ended(self) -> None:
        term_ended(self)

    async def run(self) -> None:
        """Keep an elector process running and follow what it publishes, until cancelled (then it is stopped
        and waited for) or until it has died MAX_DEATHS times within DEATH_WINDOW lease durations."""
        deaths: list[float] = []
        while True:
            process = self.process = self._ctx.Process(
                target=elect_in_child,
                args=(self.settings, self._shared, self.heartbeat, self.writes, *_log_target()),
                name=f"lease-{self.identity}",
                daemon=True,
            )
            # Off this loop: a start waits for the forkserver, which on a starved CPU took seconds.
            starting = asyncio.ensure_future(asyncio.to_thread(process.start))
            try:
                await asyncio.shield(starting)
                while process.is_alive():
                    self._look()
                    await asyncio.sleep(POLL)
            finally:
                await asyncio.wait({starting})  # a start under way has ended before it is undone
                if starting.exception() is None and process.is_alive():  # cancelled: it steps down on SIGTERM
                    await _stop(process)
                self._shared[UNTIL] = 0.0  # nobody writes it now; a dead elector's T is not waited out
                self._ended()
            now = time.monotonic()
            deaths = [t for t in deaths if now - t < DEATH_WINDOW * self.settings.lease_duration] + [now]
            if len(deaths) >= MAX_DEATHS:
                raise ElectorDied(f"the lease's elector process died {len(deaths)} times; exit code {process.exitcode}")
            log.error(
                "%s: the lease's elector process exited (code %s); restarting it in %.0fs",
                self.identity,
                process.exitcode,
                RESTART_AFTER * self.settings.lease_duration,
            )
            await asyncio.sleep(RESTART_AFTER * self.settings.lease_duration)


async def _stop(process: multiprocessing.process.BaseProcess) -> None:
    process.terminate()
    end = time.monotonic() + STOP_S
    while process.is_alive() and time.monotonic() < end:
        await asyncio.sleep(0.02)
    if process.is_alive():  # hung (or stopped): it renews nothing more once killed
        process.kill()
        await asyncio.to_thread(process.join, 1.0)


def _log_target() -> tuple[int, int]:
    """(file descriptor, level) of this process's log: the elector writes to stdout if it does, else to stderr
    (a spawned process inherits only those two)."""
    root = logging.getLogger()
    stream = next((h.stream for h in root.handlers if isinstance(h, logging.StreamHandler)), sys.stderr)
    try:
        fd = 1 if stream.fileno() == 1 else 2
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor
        fd = 2
    return fd, root.getEffectiveLevel()


# -- in the elector's process -----------------------------------------------------------------------------
def elect_in_child(
    settings: LeaseSettings, shared: Shared, heartbeat: Heartbeat | None, writes: Writes | None, log_fd: int, level: int
) -> None:
    logging.basicConfig(stream=open(log_fd, "w", buffering=1, closefd=False), level=level, format=FORMAT)  # noqa: SIM115
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the scheduler's to handle: it stops this one
    parent = multiprocessing.parent_process()
    assert parent is not None
    asyncio.run(_elect(settings, shared, parent.sentinel, heartbeat, writes))


async def _elect(
    settings: LeaseSettings, shared: Shared, parent: int, heartbeat: Heartbeat | None, writes: Writes | None
) -> None:
    port = await KubeClient.connect(settings.kubeconfig)
    if settings.user_agent:
        port.api.user_agent = settings.user_agent

    def publish(until: float, began: bool) -> None:
        if began:  # counted before its T is written, so a T is never read under the term before it
            shared[TERM] += 1
        shared[UNTIL] = until

    elector = LeaderElector(
        port,
        settings.namespace,
        settings.name,
        settings.identity,
        settings.lease_duration,
        settings.retry_period,
        settings.renew_deadline,
        publish=publish,
        heartbeat=heartbeat,
        writes=writes,
    )
    election = asyncio.create_task(elector.elect())
    loop = asyncio.get_running_loop()
    loop.add_reader(parent, election.cancel)  # the scheduler's process is gone: no lease renewed for it
    loop.add_signal_handler(signal.SIGTERM, election.cancel)
    try:
        await election
    except asyncio.CancelledError:
        log.info("%s: the elector stops", settings.identity)
    finally:
        shared[UNTIL] = 0.0
        await port.close()
