"""The admission webhook's HTTPS server: on a thread and event loop of its own, so it answers within its
timeout whatever the scheduling loop is doing (a long engine cycle blocks that loop, never this one), with a
serving certificate that follows its files when they rotate (cert-manager renews the Secret, the kubelet
swaps the mounted files), and whatever else the app reads from mounted files checked as often (`watch`:
the trusted identities).

Any pod in the cluster can reach it, and every GPU pod's creation waits on it (failurePolicy Fail), so a client
holding connections open must not run it, or the process it shares with the scheduler, out of descriptors: a
TLS handshake and each request (from its first byte to its body's last) must arrive within `arrival` seconds,
an idle connection is closed after IDLE, and at most half the process's descriptors are its connections."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import ssl
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

log = logging.getLogger(__name__)

# The longest timeoutSeconds the API server allows a webhook: a request slower to arrive is answered too late.
ARRIVAL = 30.0
# Longer than the idle timeout of the API server's client (Go's, 90 s), so that it always closes an idle connection
# first: a close from our side may cross a review it is sending, and that call fails.
IDLE = 120.0


class ReloadingCert:
    """A server SSLContext whose certificate is loaded again when its files change. New handshakes use the
    new certificate; a half-written pair (the key not yet matching) keeps the old one until it is whole."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert_file, key_file)
        self._seen = self._stamp()
        self.reloads = 0

    def _stamp(self) -> tuple:
        out = []
        for f in (self.cert_file, self.key_file):
            try:
                st = os.stat(f)  # follows the ..data symlink a Secret volume swaps
            except OSError:
                return ()
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def check(self) -> bool:
        """Reload if the files changed since the last load; True when a new certificate is in use."""
        stamp = self._stamp()
        if not stamp or stamp == self._seen:
            return False
        try:
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as err:
            log.warning("webhook certificate not reloaded yet: %s", err)
            return False
        self._seen = stamp
        self.reloads += 1
        log.info("webhook serving certificate reloaded from %s", self.cert_file)
        return True


@dataclass(slots=True)
class Connections:
    """The webhook's open connections (by aiohttp's handler of each), how many may be, how many were refused."""

    arrival: float
    limit: int
    open: dict[asyncio.BaseProtocol, _Bounded] = field(default_factory=dict)
    refused: int = 0  # closed at once because `limit` were open


class _Bounded(asyncio.Protocol):
    """One connection: aiohttp's handler, closed if a request takes longer than `arrival` to arrive."""

    def __init__(self, inner: asyncio.Protocol, conns: Connections) -> None:
        self.inner, self.conns = inner, conns
        self.transport: asyncio.Transport | None = None
        self._late: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if len(self.conns.open) >= self.conns.limit:
            self.conns.refused += 1
            transport.abort()  # aiohttp never sees it
            return
        self.transport = transport
        self.conns.open[self.inner] = self
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.expect()  # a request's first byte
        self.inner.data_received(data)

    def expect(self) -> None:
        if self._late is None and self.transport is not None:
            self._late = asyncio.get_running_loop().call_later(self.conns.arrival, self._too_slow)

    def arrived(self) -> None:
        if self._late is not None:
            self._late.cancel()
            self._late = None

    def _too_slow(self) -> None:
        log.warning("webhook connection closed: a request took over %g s to arrive", self.conns.arrival)
        if self.transport is not None:
            self.transport.abort()  # its descriptor is freed now, not after a TLS goodbye the client may never read

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return  # refused: aiohttp never saw it
        self.arrived()
        self.conns.open.pop(self.inner, None)
        self.inner.connection_lost(exc)


def _half_the_descriptors() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return sys.maxsize if soft == resource.RLIM_INFINITY else soft // 2


class WebhookServer:
    def __init__(
        self,
        app: Callable[[], web.Application],
        host: str,
        port: int,
        cert_file: str,
        key_file: str,
        reload_every: float = 1.0,
        watch: tuple[Callable[[], object], ...] = (),
        arrival: float = ARRIVAL,
        max_connections: int | None = None,
    ) -> None:
        self.make_app, self.host, self.requested_port = app, host, port
        self.cert = ReloadingCert(cert_file, key_file)
        self.reload_every, self.watch = reload_every, watch
        self.connections = Connections(arrival, max_connections or _half_the_descriptors())
        self._server: asyncio.Server | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="webhook")
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._reloader: asyncio.Task | None = None

    def start(self) -> WebhookServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        app = self.make_app()
        app.middlewares.append(self._read_in_time)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, keepalive_timeout=IDLE)
        await self._runner.setup()
        handlers = self._runner.server
        assert handlers is not None

        # Served here rather than by an aiohttp site, which cannot bound the TLS handshake (asyncio's default: 60 s).
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Bounded(handlers(), self.connections),
            self.host,
            self.requested_port,
            ssl=self.cert.context,
            ssl_handshake_timeout=self.connections.arrival,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._reloader = asyncio.create_task(self._reload())

    @web.middleware
    async def _read_in_time(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """The body is read here, under the deadline its request's first byte set (or now, for one whose bytes
        all came with the request before it), which ends once it is in."""
        conn = self.connections.open.get(request.protocol)
        if conn is not None:
            conn.expect()
        try:
            await request.read()
        finally:
            if conn is not None:
                conn.arrived()
        return await handler(request)

    async def _reload(self) -> None:
        while True:
            await asyncio.sleep(self.reload_every)
            self.cert.check()
            for check in self.watch:
                check()

    def stop(self) -> None:
        async def _stop() -> None:
            if self._reloader is not None:
                self._reloader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._reloader
            if self._server is not None:
                self._server.close()
            if self._runner is not None:
                await self._runner.cleanup()

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
