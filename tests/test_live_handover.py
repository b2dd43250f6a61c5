"""A hung leader hands its lease over (k8s/leader.py, given the loop's writes: k8s/writes.py), over HTTP
against the fake in a process of its own: the fence closes first, the Lease is released as a graceful stop
releases it, and a standby takes over within the heartbeat's bound and a retry, not after the lease expires;
never while a write of the hung loop may still land."""

from __future__ import annotations

import asyncio
import time

import pytest

from chaos import chaos_pod
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.heartbeat import Heartbeat
from fairgpu.k8s.port import LEASES, PODS
from fairgpu.k8s.writes import Writes
from live_setup import TINY, setup
from test_live_fencing import decision_writes
from test_live_liveness import NS, binds_by, finish, lease_puts, on_the_wire, start
from test_live_scheduling import until

DURATION, RETRY, RENEW = 8.0, 0.25, 5.0  # a lease long enough that its expiry cannot pass for a hand-over
STALE, EVERY = 2.0, 0.5


def hang_r1(monkeypatch, phase: dict) -> asyncio.Event:
    """From now on r1's next pass waits on an await that returns only when the returned event is set."""
    step = Controller.step
    gate = asyncio.Event()

    async def hung(self: Controller) -> None:
        if self is phase["ctl"] and phase["hang"]:
            phase["hung_at"] = phase["hung_at"] or time.monotonic()
            await gate.wait()
        await step(self)

    monkeypatch.setattr(Controller, "step", hung)
    return gate


@pytest.mark.parametrize("where", ["thread", "process"])
def test_a_hung_leader_hands_its_lease_over_and_binds_nothing_when_it_wakes(fake_process, tmp_path, monkeypatch, where):
    """r1 leads and binds; its loop then hangs on an await that never returns. Its elector steps down once the
    heartbeat is 2 s old and releases the lease: r2 leads within the bound, a retry and a second of slack of
    the hang, where before it waited out the 8 s lease (r1's last write to the lease is its release, which r2
    took at its next attempt). The hung await is then released: r1, woken, sends no Binding, annotation,
    lock or Eviction, r2 binds what arrives, and r1's elector does not win the lease back."""
    fake_process.control("device-plugin")
    kubeconfig = fake_process.kubeconfig(str(tmp_path / "kc"))
    phase: dict = {"ctl": None, "hang": False, "hung_at": 0.0}
    gate = hang_r1(monkeypatch, phase)
    lease = (DURATION, RETRY, RENEW)

    async def go() -> tuple[float, float, float, dict, bool]:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=2, gpus=4)
        r1 = await start(kubeconfig, "r1", where, Heartbeat(STALE, EVERY), lease, Writes())
        await until(r1[0].leading.is_set, 30, "r1 leading")
        r2 = await start(kubeconfig, "r2", where, Heartbeat(STALE, EVERY), lease, Writes())
        phase["ctl"] = r1[1]
        try:
            await port.create(PODS, chaos_pod("a", "p0", TINY), "a")
            await until(lambda: r1[1].stats.binds == 1, 10, "r1's bind")
            phase["hang"] = True
            await port.create(PODS, chaos_pod("a", "h0", TINY), "a")
            await until(lambda: phase["hung_at"], 10, "the loop to hang")
            await until(r2[0].leading.is_set, STALE + 4 * RETRY + 2.0, "the standby's take-over")
            took = time.monotonic() - phase["hung_at"]
            await until(lambda: r2[1].stats.binds == 1, 10, "r2 binding h0")
            gate.set()  # the hung await returns: r1's loop runs on
            woke = time.monotonic()
            await asyncio.sleep(1.0)
            await port.create(PODS, chaos_pod("a", "after", TINY), "a")
            await until(lambda: r2[1].stats.binds == 2, 10, "r2 binding what arrives next")
            held = await port.get(LEASES, "fairgpu", NS)
            return took, woke, phase["hung_at"], held, r1[0].leading.is_set()
        finally:
            await finish(r1, r2)
            await port.close()

    took, woke, hung_at, held, r1_leads = asyncio.run(asyncio.wait_for(go(), 60))
    assert took <= STALE + 2 * RETRY + 1.0, took  # old code: the lease's expiry, 8 s more
    assert held["spec"]["holderIdentity"] == "r2" and not r1_leads
    requests = fake_process.control("requests")["requests"]
    r1_lease, r2_lease = lease_puts(requests, "fairgpu/r1"), lease_puts(requests, "fairgpu/r2")
    took_over = min(r2_lease)
    released = max(t for t in r1_lease if t < took_over)
    assert took_over - released <= 2 * RETRY + 0.5  # r2 took the released lease at its next attempt
    assert max(r1_lease) == released  # r1's elector never renewed nor won it back
    assert decision_writes(requests, "fairgpu/r1", hung_at) == []  # the hung pass decided nothing it sent
    assert decision_writes(requests, "fairgpu/r1", woke) == []
    assert all(t < released for t in binds_by(requests, "fairgpu/r1")) and len(binds_by(requests, "fairgpu/r2")) == 2


def test_a_hung_leader_with_a_binding_on_the_wire_leaves_its_lease_to_expire(fake_process, tmp_path, monkeypatch):
    """The loop hangs while one of its Bindings is held 6 s by the API server: it may land after a standby
    took over, so the elector steps down but does not release the lease (the step-down's news cancels the
    Binding on the wire: its fate stays unknown for a lease duration); r2 takes over only once it expired."""
    fake_process.control("device-plugin")
    kubeconfig = fake_process.kubeconfig(str(tmp_path / "kc"))
    phase: dict = {"ctl": None, "hang": False, "hung_at": 0.0}
    gate = hang_r1(monkeypatch, phase)
    lease = (3.0, RETRY, 2.0)

    async def go() -> float:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=1, gpus=4)
        r1 = await start(kubeconfig, "r1", "thread", Heartbeat(1.5, EVERY), lease, Writes())
        await until(r1[0].leading.is_set, 30, "r1 leading")
        r2 = await start(kubeconfig, "r2", "thread", Heartbeat(1.5, EVERY), lease, Writes())
        phase["ctl"] = r1[1]
        try:
            fake_process.control("delay", seconds=6.0, path_contains="/binding")
            await port.create(PODS, chaos_pod("a", "p0", TINY), "a")
            await on_the_wire(r1[1])
            phase["hang"] = True
            await port.create(PODS, chaos_pod("a", "h0", TINY), "a")
            await until(lambda: phase["hung_at"], 10, "the loop to hang")
            await until(r2[0].leading.is_set, 1.5 + 2 * RETRY + 3.0 + 3.0, "the standby's take-over")
            gate.set()
            return phase["hung_at"]
        finally:
            await finish(r1, r2)
            await port.close()

    asyncio.run(asyncio.wait_for(go(), 40))
    requests = fake_process.control("requests")["requests"]
    took_over = min(lease_puts(requests, "fairgpu/r2"))
    assert max(t for t in lease_puts(requests, "fairgpu/r1") if t < took_over) + 3.0 <= took_over  # it expired
