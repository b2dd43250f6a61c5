"""Leader election's two clocks, on a clock the test moves: a standby takes over an unrenewed lease no
sooner than a lease duration after it last saw the record change, and no later than one retry after that;
a leader that cannot renew steps down before any standby may take over, so two never lead at once."""

from __future__ import annotations

import asyncio

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
                await asyncio.sleep(0.01)
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
