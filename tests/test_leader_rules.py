"""Leader election's two clocks, on a clock the test moves: a standby takes over an unrenewed lease no
sooner than a lease duration after it last saw the record change, and no later than one retry after that;
a leader that cannot renew steps down before any standby may take over, so two never lead at once."""

from __future__ import annotations

import asyncio
import copy
import selectors

import pytest

from fairgpu.errors import KubeError
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.leader import LeaderElector
from fairgpu.k8s.port import LEASES

LEASE = 10.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Partitioned:
    """A replica's connection to the apiserver, which the test can cut; counts the replica's attempts. The
    connection the elector makes for its own thread (`reconnect`) is cut and counted with this one."""

    def __init__(self, port: KubeClient, link: Partitioned | None = None) -> None:
        self.port, self.link, self.cut, self.attempts = port, link or self, False, 0

    async def reconnect(self) -> Partitioned:
        return Partitioned(await self.port.reconnect(), self.link)

    def __getattr__(self, name: str):
        attr = getattr(self.port, name)
        if not callable(attr):
            return attr

        async def call(*args, **kw):
            self.link.attempts += name == "get"  # every attempt reads the lease first
            if self.link.cut:
                raise OSError("network partition")
            return await attr(*args, **kw)

        return call


def test_a_standby_takes_over_exactly_when_the_lease_it_watches_expires(fake_api, tmp_path):
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> None:
        clock = Clock()
        ports = [await KubeClient.connect(kubeconfig) for _ in range(2)]
        r1 = LeaderElector(ports[0], "fairgpu-system", "fairgpu", "A", LEASE, 1.0, monotonic=clock)
        r2 = LeaderElector(ports[1], "fairgpu-system", "fairgpu", "B", LEASE, 1.0, monotonic=clock)
        assert await r1.try_acquire_or_renew()
        assert not await r2.try_acquire_or_renew()  # held, and just renewed as far as B knows
        clock.t = 6.0
        assert await r1.try_acquire_or_renew()  # A renews: B's count starts again when it sees that
        clock.t = 7.0
        assert not await r2.try_acquire_or_renew()
        clock.t = 7.0 + LEASE - 0.5  # A stopped renewing at 6, but B first saw that record at 7
        assert not await r2.try_acquire_or_renew()
        clock.t = 7.0 + LEASE
        assert await r2.try_acquire_or_renew()
        lease = await ports[0].get(LEASES, "fairgpu", "fairgpu-system")
        assert lease["spec"]["holderIdentity"] == "B" and lease["spec"]["leaseTransitions"] == 1
        assert not await r1.try_acquire_or_renew()  # A comes back: B holds a fresh lease
        for p in ports:
            await p.close()

    asyncio.run(asyncio.wait_for(go(), 30))


def test_a_leader_cut_off_steps_down_before_the_standby_takes_over(fake_api, tmp_path):
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> None:
        clock, step = Clock(), 0.25
        ports = [await KubeClient.connect(kubeconfig) for _ in range(2)]
        link, other = Partitioned(ports[0]), Partitioned(ports[1])
        # Attempts every 10 ms of real time; the test moves its clock by `step` only after both replicas made
        # two more attempts (one of them wholly at the new time), so each sees every moment of the clock.
        a = LeaderElector(link, "fairgpu-system", "fairgpu", "A", LEASE, 0.01, monotonic=clock)  # type: ignore[arg-type]
        b = LeaderElector(other, "fairgpu-system", "fairgpu", "B", LEASE, 0.01, monotonic=clock)  # type: ignore[arg-type]

        async def both_looked() -> None:
            seen = (link.attempts, other.attempts)
            for _ in range(500):
                if link.attempts >= seen[0] + 2 and other.attempts >= seen[1] + 2:
                    return
                await asyncio.sleep(1 / 64)
            raise AssertionError("the replicas stopped trying")

        task_a = asyncio.create_task(a.run())
        await asyncio.wait_for(a.leading.wait(), 10)
        task_b = asyncio.create_task(b.run())
        await both_looked()
        assert a.leading.is_set() and not b.leading.is_set()
        link.cut = True
        cut_at = clock.t
        down = up = None
        while up is None and clock.t < cut_at + 3 * LEASE:
            clock.t += step
            await both_looked()
            assert not (a.leading.is_set() and b.leading.is_set()), clock.t  # never two leaders
            if down is None and not a.leading.is_set():
                down = clock.t
            if up is None and b.leading.is_set():
                up = clock.t
        assert down is not None and up is not None
        # A's last renewal was at cut_at: it stops leading at 2/3 of the lease, not before and not much after.
        assert cut_at + LEASE * 2 / 3 <= down <= cut_at + LEASE * 2 / 3 + step
        # B saw A's last record at cut_at (it polls every retry): it takes over a lease duration later.
        assert cut_at + LEASE <= up <= cut_at + LEASE + step, (cut_at, up)
        link.cut = False
        await both_looked()
        assert b.leading.is_set() and not a.leading.is_set()  # the old leader does not take it back
        for t in (task_a, task_b):
            t.cancel()
        await asyncio.gather(task_a, task_b, return_exceptions=True)
        for p in ports:
            await p.close()

    asyncio.run(asyncio.wait_for(go(), 60))


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on a clock of its own, which jumps to the next timer whenever nothing is ready: timeouts,
    sleeps and the elector's step-down timer all run on it, to the microsecond and in no real time."""

    def __init__(self) -> None:
        self.now = 0.0
        loop = self

        class Selector(selectors.DefaultSelector):
            def select(self, timeout: float | None = None):
                ready = super().select(0)
                if not ready and timeout is None:
                    raise RuntimeError("the virtual clock has nothing left to wait for")
                if not ready:
                    loop.now += timeout or 0.0
                return ready

        super().__init__(Selector())

    def time(self) -> float:
        return self.now


class SlowLeases:
    """An apiserver's lease store in memory, on the loop's clock: each request is answered `latency(t)` seconds
    after it was sent at t (an error when `failing(t)`), and only then applied."""

    def __init__(self, loop: VirtualLoop, latency, failing) -> None:
        self.loop, self.latency, self.failing = loop, latency, failing
        self.leases: dict[str, dict] = {}
        self.version = 0

    async def reconnect(self) -> SlowLeases:
        return self

    async def close(self) -> None:
        pass

    async def _answer(self) -> None:
        sent = self.loop.time()
        await asyncio.sleep(self.latency(sent))
        if self.failing(sent):
            raise KubeError(500, "InternalError", "etcdserver: request timed out")

    def _store(self, name: str, body: dict) -> dict:
        self.version += 1
        self.leases[name] = {"metadata": {"name": name, "resourceVersion": str(self.version)}, "spec": body["spec"]}
        return copy.deepcopy(self.leases[name])

    async def get(self, kind, name: str, namespace: str | None = None) -> dict:
        await self._answer()
        if name not in self.leases:
            raise KubeError(404, "NotFound", name)
        return copy.deepcopy(self.leases[name])

    async def create(self, kind, body: dict, namespace: str | None = None) -> dict:
        await self._answer()
        if body["metadata"]["name"] in self.leases:
            raise KubeError(409, "AlreadyExists", body["metadata"]["name"])
        return self._store(body["metadata"]["name"], body)

    async def replace(self, kind, name: str, body: dict, namespace: str | None = None) -> dict:
        await self._answer()
        if body["metadata"]["resourceVersion"] != self.leases[name]["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", name)
        return self._store(name, body)


def test_a_renewal_begun_just_before_the_term_ends_is_cut_off_at_the_term_end_not_answered_late():
    """On a clock the test controls (times are binary fractions, exact in floating point). Renew deadline 10 s,
    an attempt every 2 s. From t = 1 the apiserver fails each request after 0.5 s, so the term won at 0 is never
    renewed and the attempts drift to 2.5, 5, 7.5 and 9.5; from t = 9 it answers again, 0.375 s per request.
    The attempt begun at 9.5, with half a second of the term left, is given up at 10 (its write, due at 10.25,
    never lands) and the replica stops leading then, until its next attempt at 12 wins a new term at 12.75. Let
    run past the term's end, that renewal would land at 10.25 and make the replica leader again at once, on a
    term it had already stepped down from."""
    loop = VirtualLoop()
    apiserver = SlowLeases(loop, lambda t: 0.0 if t < 1 else (0.5 if t < 9 else 0.375), lambda t: 1 <= t < 9)
    a = LeaderElector(apiserver, "fairgpu-system", "fairgpu", "A", 15.0, 2.0, renew_deadline=10.0, monotonic=loop.time)  # type: ignore[arg-type]
    began: list[float] = []
    lost: list[float] = []
    a.on_lost.append(lambda: lost.append(loop.time()))
    seen: dict[str, tuple[bool, float]] = {}

    async def watch() -> None:
        while True:
            await a.leading.wait()
            began.append(loop.time())
            while a.leading.is_set():
                await asyncio.sleep(1 / 64)

    async def go() -> None:
        # On this loop, as in the elector's own process (run() would give it a thread of its own).
        election, watcher = asyncio.ensure_future(a.elect()), asyncio.ensure_future(watch())
        await asyncio.sleep(10.5)
        seen["10.5"] = (a.leading.is_set(), a.remaining())
        await asyncio.sleep(3.0)
        election.cancel()
        watcher.cancel()
        await asyncio.gather(election, watcher, return_exceptions=True)

    try:
        loop.run_until_complete(go())
    finally:
        loop.close()
    assert began == [0.0, 12.75]
    assert lost == [10.0, 13.5]  # and when the election is stopped
    assert seen["10.5"] == (False, 0.0)
    assert a.term == 2


def test_an_election_that_fails_on_its_own_thread_raises_its_error_to_the_caller():
    """The elector's thread cannot open its own connection: run() raises that error where the controller awaits
    it (so `fairgpu run` stops with it) instead of returning as if the election had been stopped."""

    class Unreachable:
        async def reconnect(self) -> None:
            raise OSError("connection refused: apiserver unreachable")

    async def go() -> None:
        a = LeaderElector(Unreachable(), "fairgpu-system", "fairgpu", "A")  # type: ignore[arg-type]
        await asyncio.wait_for(a.run(), 10)

    with pytest.raises(OSError, match="apiserver unreachable"):
        asyncio.run(go())


def test_a_replica_that_loses_the_race_for_the_lease_does_not_lead():
    """Another replica writes the lease between this one's read and its write: the create or the update is
    answered 409 Conflict, which means the other one won. The attempt answers False (not leading, not an
    error), whether it was taking the lease or renewing its own."""
    loop = VirtualLoop()

    class Raced(SlowLeases):
        def _b_writes(self, name: str) -> None:
            self._store(name, {"spec": {"holderIdentity": "B", "leaseDurationSeconds": 15}})

        async def create(self, kind, body: dict, namespace: str | None = None) -> dict:
            self._b_writes(body["metadata"]["name"])
            return await super().create(kind, body, namespace)

        async def replace(self, kind, name: str, body: dict, namespace: str | None = None) -> dict:
            self._b_writes(name)
            return await super().replace(kind, name, body, namespace)

    apiserver = Raced(loop, lambda t: 0.0, lambda t: False)
    a = LeaderElector(apiserver, "fairgpu-system", "fairgpu", "A", monotonic=loop.time)  # type: ignore[arg-type]
    try:
        assert loop.run_until_complete(a.try_acquire_or_renew()) is False  # taking it: the create lost
        apiserver._store("fairgpu", {"spec": {"holderIdentity": "A", "leaseDurationSeconds": 15}})
        assert loop.run_until_complete(a.try_acquire_or_renew()) is False  # renewing its own: the update lost
    finally:
        loop.close()
    assert apiserver.leases["fairgpu"]["spec"]["holderIdentity"] == "B"
