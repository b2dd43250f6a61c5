"""Liveness on the live path, over HTTP against the fake (k8s/heartbeat.py, k8s/replica.py): a scheduler whose
loop hangs gives up its lease and fails /healthz, while a slow or idle one keeps it; a stopped leader hands the
lease over at once, after its last Binding, and never releases a lease another replica holds."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from audit import audit
from chaos import chaos_pod
from fairgpu.errors import KubeError
from fairgpu.framework.scheduler import CycleResult, Scheduler
from fairgpu.k8s import replica as replica_module
from fairgpu.k8s.app import live_apps
from fairgpu.k8s.client import KubeClient
from fairgpu.k8s.controller import Controller
from fairgpu.k8s.elector_process import ElectorProcess
from fairgpu.k8s.heartbeat import Heartbeat
from fairgpu.k8s.leader import LeaderElector, release_lease
from fairgpu.k8s.port import LEASES, PODS
from fairgpu.k8s.replica import run_replica
from fairgpu.observe.server import Beside
from live_setup import ONE, TINY, replica, setup
from test_live_leadership import busy
from test_live_scheduling import until

NS = "fairgpu-system"
DURATION, RENEW, RETRY = 3.0, 2.0, 0.25  # the chaos soak's lease
EVERY, STALE = 0.5, 2.5  # heartbeat: an idle pass every 0.5 s; hung after 2.5 s without one
SLOW = 1.2  # seconds each slow pass holds the loop


def elector(where: str, port: KubeClient, kubeconfig: str, ident: str, beat: Heartbeat, lease, writes=None):
    if where == "thread":
        return LeaderElector(port, NS, "fairgpu", ident, *lease, heartbeat=beat, writes=writes)
    return ElectorProcess(kubeconfig, NS, "fairgpu", ident, *lease, f"fairgpu/{ident}", heartbeat=beat, writes=writes)


async def start(kubeconfig: str, ident: str, where: str, beat: Heartbeat, lease=(DURATION, RETRY, RENEW), writes=None):
    """A replica as `fairgpu run` runs it (run_replica): (elector, controller, its task, its port). Without
    `writes` (k8s/writes.py) its elector cannot know whether the loop's writes have stopped, so a hung leader's
    lease is left to expire; with them it is handed over (test_live_handover.py)."""
    e, ctl, port = await replica(
        kubeconfig,
        ident,
        lambda port: elector(where, port, kubeconfig, ident, beat, lease, writes),
        heartbeat=beat,
        **({} if writes is None else {"writes": writes}),
    )
    return e, ctl, asyncio.create_task(run_replica(ctl, e)), port


async def alone_on_one_node(kubeconfig: str, beat: Heartbeat):
    """One replica (thread elector) on a fresh one-node cluster, running: (elector, controller, its task, its
    port, when it lost the lease)."""
    lease = (DURATION, RETRY, RENEW)
    e, ctl, port = await replica(
        kubeconfig, "r1", lambda p: elector("thread", p, kubeconfig, "r1", beat, lease), heartbeat=beat
    )
    await setup(port, nodes=1, gpus=2, tenants=("a",))
    lost: list[float] = []
    e.on_lost.append(lambda: lost.append(time.monotonic()))
    return e, ctl, asyncio.create_task(run_replica(ctl, e)), port, lost


async def finish(*replicas) -> None:
    for _, _, task, port in replicas:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await port.close()


def lease_puts(requests: list[dict], agent: str) -> list[float]:
    return [
        r["t"]
        for r in requests
        if "/leases/" in r["path"] and r["verb"] == "PUT" and r["code"] < 300 and r["agent"] == agent
    ]


def binds_by(requests: list[dict], agent: str) -> list[float]:
    return [r["t"] for r in requests if r["path"].endswith("/binding") and r["code"] == 201 and r["agent"] == agent]


@pytest.mark.parametrize("where", ["thread", "process"])
def test_a_hung_loop_loses_the_lease_to_the_standby_and_a_slow_one_keeps_it(fake_process, tmp_path, monkeypatch, where):
    """The leader's scheduling loop is first slow (every pass holds it 1.2 s while pods stream in): it keeps
    the lease through three such passes and more than a lease duration, and the standby never leads. Then the
    loop hangs on an await that never returns while its elector is healthy: before, the elector renewed on and
    no standby could ever take over; now it stops renewing once the heartbeat is 2.5 s old, steps down, and
    the standby takes over within that bound plus a retry and the lease duration, and binds. From the fake's
    log: r1's Bindings all precede r2's take-over, which came a lease duration after r1's last renewal (its
    elector is not given the loop's writes: the lease is left to expire; test_live_handover.py hands it over)."""
    fake_process.control("device-plugin")
    kubeconfig = fake_process.kubeconfig(str(tmp_path / "kc"))
    step = Controller.step
    phase = {"ctl": None, "now": "slow", "hung_at": 0.0, "slow_passes": 0}

    async def slow_then_hung(self: Controller) -> None:
        if self is phase["ctl"] and phase["now"] == "slow":
            phase["slow_passes"] += 1
            busy(SLOW)
        elif self is phase["ctl"] and phase["now"] == "hung":
            phase["hung_at"] = phase["hung_at"] or time.monotonic()
            await asyncio.Event().wait()  # never returns: a wedged await
        await step(self)

    monkeypatch.setattr(Controller, "step", slow_then_hung)

    async def go():
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=4, gpus=4)
        r1 = await start(kubeconfig, "r1", where, Heartbeat(STALE, EVERY))
        await until(r1[0].leading.is_set, 30, "r1 leading")
        r2 = await start(kubeconfig, "r2", where, Heartbeat(STALE, EVERY))
        phase["ctl"] = r1[1]
        lost: list[float] = []
        r1[0].on_lost.append(lambda: lost.append(time.monotonic()))
        try:
            slow_from = time.monotonic()
            i = 0
            while time.monotonic() - slow_from < DURATION + 0.5:  # each arrival wakes a slow pass
                await port.create(PODS, chaos_pod("a", f"s{i}", TINY), "a")
                await asyncio.sleep(0.3)
                i += 1
            slow = (time.monotonic() - slow_from, list(lost), r2[0].leading.is_set(), phase["slow_passes"])
            phase["now"] = "hung"
            await port.create(PODS, chaos_pod("a", "h0", TINY), "a")
            await until(lambda: phase["hung_at"], 10, "the loop to hang")
            await until(r2[0].leading.is_set, STALE + RETRY + DURATION + 5, "the standby's take-over")
            took = time.monotonic() - phase["hung_at"]
            assert not r1[0].leading.is_set() and r1[0].remaining() == 0.0
            await port.create(PODS, chaos_pod("a", "after", TINY), "a")
            await until(lambda: "a/after" in r2[1].carry._landed or r2[1].stats.binds > 0, 10, "a bind by r2")
            lease = await port.get(LEASES, "fairgpu", NS)
        finally:
            await finish(r1, r2)
            await port.close()
        return slow, took, lease

    (seconds, lost, r2_led, passes), took, lease = asyncio.run(asyncio.wait_for(go(), 90))
    assert seconds >= DURATION and passes >= 3 and lost == [] and not r2_led, (seconds, passes, lost, r2_led)
    assert took <= STALE + 2 * RETRY + DURATION + 1.5, took  # hung → step-down → the lease expires → taken
    assert lease["spec"]["holderIdentity"] == "r2"
    requests = fake_process.control("requests")["requests"]
    r1_binds, r2_binds = binds_by(requests, "fairgpu/r1"), binds_by(requests, "fairgpu/r2")
    took_over = min(lease_puts(requests, "fairgpu/r2"))
    assert r2_binds and all(t < took_over for t in r1_binds) and took_over <= min(r2_binds)  # one leader at a time
    assert max(lease_puts(requests, "fairgpu/r1")) + DURATION <= took_over  # r1 stopped renewing; it expired


def test_healthz_fails_when_the_loop_hangs_and_not_while_it_idles(fake_api, tmp_path, monkeypatch):
    """An idle leader (nothing to schedule) for three times the bound: /healthz answers 200 and the lease is
    kept (idle passes count). Then its loop hangs on an await that never returns: /healthz answers 503 with
    the reason, and the elector steps down. Before, /healthz answered "ok" whatever the loop did."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))
    stale, every = 0.8, 0.2
    step = Controller.step
    hung: list[float] = []

    async def hang(self: Controller) -> None:
        if "a/h" in self.pods.cache:
            hung.append(time.monotonic())
            await asyncio.Event().wait()
        await step(self)

    monkeypatch.setattr(Controller, "step", hang)

    def get(url: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    async def go():
        beat = Heartbeat(stale, every)
        e, ctl, task, port, lost = await alone_on_one_node(kubeconfig, beat)
        try:
            async with Beside(live_apps(ctl, "test").probes, "127.0.0.1", 0) as probes:
                url = f"{probes.url}/healthz"
                await until(lambda: ctl.stats.cycles, 10, "the lease and the term's first cycle")
                first = ctl.stats.cycles
                await asyncio.sleep(3 * stale)
                idle = await asyncio.to_thread(get, url), list(lost), e.leading.is_set(), ctl.stats.cycles - first
                await port.create(PODS, chaos_pod("a", "h", ONE), "a")
                await until(lambda: hung, 10, "the loop to hang")
                await asyncio.sleep(stale + 0.3)
                stuck = await asyncio.to_thread(get, url), e.leading.is_set()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await port.close()
        return idle, stuck

    ((code, body), lost, leading, cycles), ((stuck_code, stuck_body), still_leading) = asyncio.run(
        asyncio.wait_for(go(), 30)
    )
    assert (code, body, lost, leading) == (200, "ok", [], True)
    assert cycles == 0  # idle passes run no engine cycle (metrics count only real ones)
    assert stuck_code == 503 and "the scheduling loop has not passed for" in stuck_body, (stuck_code, stuck_body)
    assert not still_leading


def test_a_cycle_longer_than_the_heartbeat_bound_is_no_hung_loop(fake_api, tmp_path, monkeypatch):
    """An engine cycle that runs three times the heartbeat bound (a big cluster's cycle, progressing in slices
    of CYCLE_SLICE) keeps the lease and binds what it decided: the loop beats at each slice. Without those
    beats the elector called the loop hung mid-cycle and stepped down, and the cycle's bind was dropped."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))
    stale, every = 0.75, 0.25
    steps = Scheduler.steps
    long: list[float] = []

    def long_cycle(self: Scheduler, now: float, result: CycleResult):
        if long:  # CPU-bound work in small steps, as a cycle over thousands of nodes is
            for _ in range(int(3 * stale / 0.004)):
                time.sleep(0.004)
                yield
        yield from steps(self, now, result)

    monkeypatch.setattr(Scheduler, "steps", long_cycle)

    async def go():
        e, ctl, task, port, lost = await alone_on_one_node(kubeconfig, Heartbeat(stale, every))
        try:
            await until(lambda: ctl.stats.cycles, 10, "the lease and the term's first cycle")
            long.append(time.monotonic())
            await port.create(PODS, chaos_pod("a", "p", ONE), "a")
            await until(lambda: ctl.stats.binds or lost, 20, "the long cycle's bind")
            return list(lost), e.leading.is_set(), ctl.stats.binds, time.monotonic() - long[0]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await port.close()

    lost, leading, binds, took = asyncio.run(asyncio.wait_for(go(), 30))
    assert (lost, leading, binds) == ([], True, 1)
    assert took >= 3 * stale  # the bind came out of a cycle three bounds long


def test_a_slow_list_at_a_terms_start_is_no_hung_loop_but_a_wedged_one_is(fake_api, tmp_path, monkeypatch):
    """A new term lists every pod again before it decides (controller.run). A list that takes 1.5 s, twice the
    heartbeat's bound (a large cluster's), keeps the lease: the loop beats while it waits. One that never comes
    back is given RESYNC_LIMIT (made 2.5 s here), then the heartbeat stops and the leader steps down."""
    from fairgpu.k8s import controller as controller_module
    from fairgpu.k8s.informer import Informer

    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))
    monkeypatch.setattr(controller_module, "RESYNC_LIMIT", 2.5)
    resync = Informer.resync
    lists: list[float] = []

    async def slow_resync(self: Informer) -> None:
        if self.kind == PODS:
            lists.append(time.monotonic())
            await asyncio.sleep(1.5 if len(lists) == 1 else 3600)  # the first slow, the next wedged
        await resync(self)

    monkeypatch.setattr(Informer, "resync", slow_resync)

    async def go() -> tuple[int, list[float], list[float]]:
        beat = Heartbeat(0.75, 0.25)
        e, ctl, task, port, lost = await alone_on_one_node(kubeconfig, beat)
        try:
            await until(lambda: ctl.stats.cycles, 10, "the first term's first cycle, after its slow list")
            slow_lost = list(lost)
            e._valid_until = 0.0  # the term ends (as when a renewal fails): the next one lists again, wedged
            e._tell(e._ended)
            await until(lambda: len(lists) == 2 and e.leading.is_set(), 10, "the next term's list")
            await until(lambda: not e.leading.is_set(), 5, "the step-down")
            wedged = time.monotonic() - lists[1]
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await port.close()
        return e.term, slow_lost, [wedged]

    terms, slow_lost, (wedged,) = asyncio.run(asyncio.wait_for(go(), 30))
    assert slow_lost == [] and terms == 2
    # Beats until the limit (the last at most one interval before it), then stale after the bound.
    assert 2.5 - 0.25 + 0.75 - 0.05 <= wedged <= 2.5 + 0.75 + RETRY + 1.0, wedged


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_to_fairgpu_run_releases_the_lease_and_a_standby_takes_it_at_once(fake_api, tmp_path):
    """`fairgpu run` leads (deploy's lease: 15 s) and has bound a pod; SIGTERM, as the kubelet sends when the
    pod is deleted. It exits 0, leaving the Lease released the way client-go's ReleaseOnCancel does (no holder,
    leaseDurationSeconds 1), and a standby takes it at its first attempt, not 15 s later. Before, SIGTERM
    killed it on the spot and the lease stayed its own until it expired."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def prepare() -> None:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=1, gpus=2, tenants=("a",))
        await port.create(PODS, chaos_pod("a", "p", ONE), "a")
        await port.close()

    asyncio.run(prepare())
    ports = [str(_free_port()) for _ in range(3)]
    cmd = [sys.executable, "-c", "from fairgpu.cli import app; app()", "run", "--kubeconfig", kubeconfig]
    cmd += ["--identity", "r1", "--health-host", "127.0.0.1", "--health-port", ports[0]]
    cmd += ["--metrics-host", "127.0.0.1", "--metrics-port", ports[1], "--dashboard-port", ports[2]]
    run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:

        async def bound_and_stopped() -> tuple[dict, float]:
            port = await KubeClient.connect(kubeconfig)
            try:
                await until_async(
                    port, lambda o: o["spec"].get("nodeName"), PODS, "p", "a", 60, "p bound by fairgpu run"
                )
                lease = await port.get(LEASES, "fairgpu", NS)
                assert lease["spec"]["holderIdentity"] == "r1"
                run.send_signal(signal.SIGTERM)
                stopped = time.monotonic()
                assert await asyncio.to_thread(run.wait, 20) == 0
                released = await port.get(LEASES, "fairgpu", NS)
                standby = LeaderElector(port, NS, "fairgpu", "r2", 15.0, 0.25)
                task = asyncio.create_task(standby.run())
                try:
                    await until(standby.leading.is_set, 10, "the standby's take-over")
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                return released, time.monotonic() - stopped
            finally:
                await port.close()

        released, took = asyncio.run(asyncio.wait_for(bound_and_stopped(), 90))
    finally:
        if run.poll() is None:
            run.kill()
        run.wait(10)
    spec = released["spec"]
    assert spec["holderIdentity"] == "" and spec["leaseDurationSeconds"] == 1 and spec["leaseTransitions"] == 0
    assert took < 5.0, took  # the lease duration is 15 s


async def on_the_wire(ctl: Controller) -> None:
    """Wait until the Binding the fake holds is on the wire: a write is, and still is once the pod's annotations
    and node lock (answered at once) are done."""
    await until(lambda: ctl.writes.sending, 10, "a write on the wire")
    await asyncio.sleep(0.3)
    assert ctl.writes.sending, "no Binding on the wire"


async def until_async(port, cond, kind, name, namespace, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            if cond(await port.get(kind, name, namespace)):
                return
        except KubeError:  # not there yet
            pass
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


def test_a_graceful_stop_ends_the_leaders_binds_before_it_releases_the_lease(fake_api, tmp_path):
    """Two replicas (lease 10 s) bind a stream of pods whose Bindings take 0.3 s each to land; the leader is
    stopped gracefully mid-stream. Every Binding it sent landed before its release (the fence closed, those on
    the wire were waited for), and the standby took over within a second or two, not the 10 s the lease lasts;
    no Binding by a non-leader (fake's log)."""
    fake_api.control("device-plugin")
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))
    lease = (10.0, 0.25, 6.0)

    async def go() -> float:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=40, gpus=4)
        r1 = await start(kubeconfig, "r1", "thread", Heartbeat(), lease)
        await until(r1[0].leading.is_set, 20, "r1 leading")
        r2 = await start(kubeconfig, "r2", "thread", Heartbeat(), lease)
        fake_api.control("delay", seconds=0.3, path_contains="/binding")
        try:
            for i in range(150):
                await port.create(PODS, chaos_pod("a", f"p{i}", TINY), "a")
                await asyncio.sleep(0.02)
                if i == 100:
                    assert r1[1].writes.sending, "no Binding on the wire to wait for"
                    r1[2].cancel()
                    stopped = time.monotonic()
            await until(r2[0].leading.is_set, 5, "the standby's take-over")
            await until(lambda: r2[1].stats.binds > 10, 20, "binds by the new leader")
        finally:
            await finish(r1, r2)
            await port.close()
        return stopped

    stopped = asyncio.run(asyncio.wait_for(go(), 60))
    requests = fake_api.control("requests")["requests"]
    took = min(lease_puts(requests, "fairgpu/r2")) - stopped
    released = max(lease_puts(requests, "fairgpu/r1"))  # the release is r1's last lease write
    r1_binds = binds_by(requests, "fairgpu/r1")
    assert [t for t in r1_binds if t > stopped], "no Binding was on the wire at the stop"
    assert max(r1_binds) < released < min(binds_by(requests, "fairgpu/r2"))
    assert took < 2.0, took
    report = audit(fake_api.api.store, requests, {}, set())
    assert not report.non_leader_binds and not report.overcommit, (report.non_leader_binds[:3], report.overcommit[:3])


def test_a_stop_with_a_binding_unanswered_leaves_the_lease_to_expire(fake_api, tmp_path, monkeypatch):
    """A Binding is still on the wire when the stop's wait for it ends (the API server holds it 5 s): it may
    land after a standby took over, so the lease is not released; it stays this replica's until it expires."""
    monkeypatch.setattr(replica_module, "DRAIN_S", 0.3)
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    async def go() -> dict:
        port = await KubeClient.connect(kubeconfig)
        await setup(port, nodes=1, gpus=2, tenants=("a",))
        r1 = await start(kubeconfig, "r1", "thread", Heartbeat())
        try:
            await until(r1[0].leading.is_set, 20, "r1 leading")
            fake_api.control("delay", seconds=5.0, path_contains="/binding")
            await port.create(PODS, chaos_pod("a", "p", ONE), "a")
            await on_the_wire(r1[1])
            r1[2].cancel()
            await asyncio.gather(r1[2], return_exceptions=True)
            return await port.get(LEASES, "fairgpu", NS)
        finally:
            await finish(r1)
            await port.close()

    assert asyncio.run(asyncio.wait_for(go(), 30))["spec"]["holderIdentity"] == "r1"


def test_release_never_overwrites_a_lease_another_replica_holds_or_took_meanwhile(fake_api, tmp_path):
    """r2 holds the lease: r1's release writes nothing. r1 holds it and r2 takes it over between r1's read and
    its write: the write carries the version read, is refused (409), and r2 keeps the lease."""
    kubeconfig = fake_api.kubeconfig(str(tmp_path / "kc"))

    class TakenMeanwhile:
        """r1's connection; just before its write, r2 writes the lease (a take-over racing the release)."""

        def __init__(self, port: KubeClient, other: KubeClient) -> None:
            self.port, self.other = port, other

        def __getattr__(self, name: str):
            return getattr(self.port, name)

        async def replace(self, kind, name: str, body: dict, namespace: str | None = None) -> dict:
            lease = await self.other.get(LEASES, name, namespace)
            lease["spec"]["holderIdentity"] = "r2"
            await self.other.replace(LEASES, name, lease, namespace)
            return await self.port.replace(kind, name, body, namespace)

    async def go() -> tuple[bool, dict, dict, bool, dict]:
        p1, p2 = await KubeClient.connect(kubeconfig), await KubeClient.connect(kubeconfig)
        try:
            assert await LeaderElector(p2, NS, "fairgpu", "r2").try_acquire_or_renew()
            before = await p1.get(LEASES, "fairgpu", NS)
            held_by_other = await release_lease(p1, NS, "fairgpu", "r1")
            after = await p1.get(LEASES, "fairgpu", NS)
            await p1.delete(LEASES, "fairgpu", NS)
            assert await LeaderElector(p1, NS, "fairgpu", "r1").try_acquire_or_renew()
            raced = await release_lease(TakenMeanwhile(p1, p2), NS, "fairgpu", "r1")  # type: ignore[arg-type]
            final = await p1.get(LEASES, "fairgpu", NS)
        finally:
            await p1.close()
            await p2.close()
        return held_by_other, before, after, raced, final

    held_by_other, before, after, raced, final = asyncio.run(asyncio.wait_for(go(), 30))
    assert held_by_other is False and after == before  # not a byte changed
    assert raced is False and final["spec"]["holderIdentity"] == "r2" and final["spec"]["leaseDurationSeconds"] == 15


def test_a_heartbeat_bound_below_three_idle_passes_is_refused():
    from fairgpu.errors import InputError

    with pytest.raises(InputError, match="--heartbeat-timeout: 2s must be at least 3"):
        Heartbeat(2.0, 1.0)
    assert Heartbeat(3.0, 1.0).age() is None and not Heartbeat().stale()


def test_fairgpu_run_refuses_a_heartbeat_timeout_below_three_passes(tmp_path):
    from typer.testing import CliRunner

    from fairgpu.cli import app

    result = CliRunner().invoke(app, ["run", "--heartbeat-timeout", "1"], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and "--heartbeat-timeout: 1s must be at least 3" in result.output, result.output
