"""The lease's elector in a process of its own (k8s/elector_process.py), over HTTP against the fake: a dead or
stopped elector stops the scheduler's binds by the time its published validity T runs out, before any
standby may take over; a scheduler that dies takes its elector with it; two replicas never bind at once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from audit import audit
from chaos import chaos_pod
from fairgpu.errors import ElectorDied
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.elector_process import MAX_DEATHS, RESTART_AFTER, UNTIL, ElectorProcess
from fairgpu.k8s.port import PODS
from live_setup import TINY, replica, setup
from test_live_scheduling import until

DURATION, RENEW, RETRY = 3.0, 2.0, 0.25
NS = "fairgpu-system"


def elector(kubeconfig: str, ident: str) -> ElectorProcess:
    return ElectorProcess(kubeconfig, NS, "fairgpu", ident, DURATION, RETRY, RENEW, f"fairgpu/{ident}")


async def replicas(kubeconfig: str) -> list[tuple[ElectorProcess, Controller, list[asyncio.Task], KubeClient]]:
    out = []
    for ident in ("r1", "r2"):
        e, ctl, rport = await replica(kubeconfig, ident, lambda _, i=ident: elector(kubeconfig, i))
        out.append((e, ctl, [asyncio.create_task(e.run()), asyncio.create_task(ctl.run())], rport))
    return out


async def teardown(reps, port: KubeClient) -> None:
    for e, _, tasks, rport in reps:
        if e.process is not None and e.process.is_alive():
            os.kill(e.process.pid, signal.SIGCONT)  # a stopped elector then exits on its SIGTERM at once
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await rport.close()
    await port.close()


class Stream:
    """Pods that arrive steadily and finish at once (the fake's device plugin), so binds never stop."""

    def __init__(self, port: KubeClient) -> None:
        self.port, self.created = port, 0

    async def arrive(self, n: int) -> None:
        for _ in range(n):
            await self.port.create(PODS, chaos_pod("a", f"p{self.created}", TINY), "a")
            self.created += 1
            await asyncio.sleep(0.02)


def binds_by(requests: list[dict], agent: str) -> list[float]:
    return [r["t"] for r in requests if r["path"].endswith("/binding") and r["code"] == 201 and r["agent"] == agent]


def lease_writes(requests: list[dict], agent: str) -> list[float]:
    return [
        r["t"]
        for r in requests
        if "/leases" in r["path"] and r["verb"] in ("PUT", "POST") and r["code"] < 300 and r["agent"] == agent
    ]


def leader_hit(fake_api, tmp_path, sig: signal.Signals) -> tuple[dict, list[dict], float, float, str]:
    """Two replicas bind a stream of pods; the leader's elector process gets `sig` mid-stream. Returns the
    replicas' binds, the fake's request log, the T the elector had published and when it was hit (both on
    CLOCK_MONOTONIC, as the fake's log)."""
    fake_api.control("device-plugin")
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go():
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=40, gpus=4)
        reps = await replicas(kubeconfig)
        stream = Stream(port)
        try:
            await until(lambda: any(e.leading.is_set() for e, *_ in reps), 20, "a leader")
            leader = next(e for e, *_ in reps if e.leading.is_set())
            await stream.arrive(50)
            assert leader.process is not None
            t_published = leader._shared[UNTIL]
            os.kill(leader.process.pid, sig)
            hit = time.monotonic()
            assert t_published > hit  # it was leading, and binding, under a validity still running
            await stream.arrive(300)  # ~6 s: past T, the lease's expiry and the standby's take-over
            return {e.identity: c.stats.binds for e, c, *_ in reps}, leader.identity, t_published, hit
        finally:
            await teardown(reps, port)

    binds, leader, t_published, hit = asyncio.run(asyncio.wait_for(go(), 150))
    requests = fake_api.control("requests")["requests"]
    report = audit(fake_api.api.store, requests, {}, set())
    assert not report.non_leader_binds, report.non_leader_binds[:5]
    assert not report.overcommit, report.overcommit[:5]
    return binds, requests, t_published, hit, leader


def test_a_killed_elector_stops_binding_by_its_t_and_another_replica_takes_over(fake_api, tmp_path):
    """SIGKILL to the leader's elector process: its scheduler sends no Binding after the T the elector last
    published (it stops as soon as it sees the process gone), and the standby takes the lease and binds."""
    binds, requests, t_published, hit, leader = leader_hit(fake_api, tmp_path, signal.SIGKILL)
    standby = "r2" if leader == "r1" else "r1"
    mine = binds_by(requests, f"fairgpu/{leader}")
    assert mine and max(mine) < t_published, max(mine) - t_published
    renewals = [t for t in lease_writes(requests, f"fairgpu/{leader}") if t <= hit]
    took = [t for t in lease_writes(requests, f"fairgpu/{standby}") if t > hit]
    assert took and min(took) >= renewals[-1] + DURATION  # once the lease expired on the standby's clock
    theirs = [t for t in binds_by(requests, f"fairgpu/{standby}") if t > hit]
    assert len(theirs) > 20, (len(theirs), binds)


def test_a_stopped_elector_stops_binding_before_the_lease_could_be_taken_over(fake_api, tmp_path):
    """SIGSTOP to the leader's elector (a hung process, not a dead one: the scheduler cannot tell it from a
    slow one): the scheduler's binds end by T, before the earliest moment a standby may take the lease (its
    last renewal landing plus the lease duration); the standby then takes over."""
    binds, requests, t_published, hit, leader = leader_hit(fake_api, tmp_path, signal.SIGSTOP)
    standby = "r2" if leader == "r1" else "r1"
    mine = binds_by(requests, f"fairgpu/{leader}")
    renewals = [t for t in lease_writes(requests, f"fairgpu/{leader}") if t <= hit]
    assert mine and max(mine) < t_published < renewals[-1] + DURATION, (max(mine), t_published, renewals[-1])
    took = [t for t in lease_writes(requests, f"fairgpu/{standby}") if t > hit]
    assert took and min(took) >= renewals[-1] + DURATION and max(mine) < min(took)
    assert binds[standby] > 20, binds


CHILD = """
import asyncio, sys
from fairgpu.k8s.elector_process import ElectorProcess

async def main():
    e = ElectorProcess(sys.argv[1], "fairgpu-system", "fairgpu", "p1", 3.0, 0.25, 2.0, "fairgpu/p1")
    task = asyncio.create_task(e.run())
    while not e.leading.is_set():
        await asyncio.sleep(0.02)
    print(e.process.pid, flush=True)
    await task

asyncio.run(main())
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # exited (a zombie until whoever adopted it reaps it)


def test_a_killed_scheduler_takes_its_elector_with_it_and_the_lease_is_taken_over(fake_api, tmp_path):
    """A scheduler process (with its elector process) leads; SIGKILL to the scheduler alone. Its elector
    exits by itself at once (no orphan renewing a lease for a dead scheduler), no renewal lands after, and a
    standby takes the lease over once it expired."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))
    scheduler = subprocess.Popen([sys.executable, "-c", CHILD, kubeconfig], stdout=subprocess.PIPE, text=True)
    try:
        assert scheduler.stdout is not None
        child = int(scheduler.stdout.readline())  # printed once it leads
        scheduler.kill()
        killed = time.monotonic()
        scheduler.wait(10)
        while not _gone(child):
            assert time.monotonic() - killed < 2.0, "the elector outlived its scheduler"
            time.sleep(0.02)

        async def standby() -> float:
            e = elector(kubeconfig, "r2")
            task = asyncio.create_task(e.run())
            try:
                await until(e.leading.is_set, 20, "the standby's take-over")
                return time.monotonic()
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

        took = asyncio.run(asyncio.wait_for(standby(), 40))
    finally:
        scheduler.kill()
    requests = fake_api.control("requests")["requests"]
    renewals = lease_writes(requests, "fairgpu/p1")
    assert renewals and max(renewals) < killed + 0.5  # at most one already under way when it died
    assert took >= max(renewals) + DURATION  # taken only once expired


def test_stepping_down_publishes_not_held_and_a_restarted_term_is_a_new_one(fake_api, tmp_path):
    """Cancelled, the elector writes T = 0 (its scheduler binds no more at once); started again, its next
    term has a new number, so nothing decided under the old one passes the fence."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> None:
        e = elector(kubeconfig, "r1")
        task = asyncio.create_task(e.run())
        await until(e.leading.is_set, 20, "the lease")
        first = e.term
        assert first == 1 and e.remaining() > 0.5  # a fresh elector's first term
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert e._shared[UNTIL] == 0.0 and e.remaining() == 0.0 and not e.leading.is_set()
        task = asyncio.create_task(e.run())
        try:
            await until(e.leading.is_set, 20, "the lease again")
            assert e.term == first + 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(go(), 60))


def test_a_dead_elector_is_restarted_and_one_that_keeps_dying_ends_the_scheduler(fake_api, tmp_path):
    """Killed, the elector comes back two lease durations later (a new process, leading again: nobody else
    wanted the lease); killed a third time within ten lease durations, run() gives up with ElectorDied rather
    than leave the scheduler running unelected."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))
    lease = 0.6

    async def go() -> list[int]:
        e = ElectorProcess(kubeconfig, NS, "fairgpu", "r1", lease, 0.1, 0.4)
        task = asyncio.create_task(e.run())
        pids: list[int] = []
        try:
            for _ in range(MAX_DEATHS):
                await until(e.leading.is_set, 30, "the lease")
                assert e.process is not None and e.process.pid not in pids
                pids.append(e.process.pid)
                killed = time.monotonic()
                os.kill(e.process.pid, signal.SIGKILL)
                await until(lambda: not e.leading.is_set(), 5, "the step-down")
                if len(pids) < MAX_DEATHS:
                    await until(lambda: e.process is not None and e.process.pid != pids[-1], 30, "a new elector")
                    assert time.monotonic() - killed >= RESTART_AFTER * lease - 0.1
            with pytest.raises(ElectorDied):
                await asyncio.wait_for(task, 10)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return pids

    assert len(asyncio.run(asyncio.wait_for(go(), 120))) == MAX_DEATHS
