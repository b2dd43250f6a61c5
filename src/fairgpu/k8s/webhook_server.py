"""The admission webhook's HTTPS server: on a thread and event loop of its own, so it answers within its
timeout whatever the scheduling loop is doing (a long engine cycle blocks that loop, never this one), with a
serving certificate that follows its files when they rotate (cert-manager renews the Secret, the kubelet
swaps the mounted files), and whatever else the app reads from mounted files checked as often (`watch`:
the trusted identities)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import threading
from collections.abc import Callable

from aiohttp import web

log = logging.getLogger(__name__)


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
    ) -> None:
        self.make_app, self.host, self.requested_port = app, host, port
        self.cert = ReloadingCert(cert_file, key_file)
        self.reload_every, self.watch = reload_every, watch
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
        self._runner = web.AppRunner(self.make_app(), handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.requested_port, ssl_context=self.cert.context)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._reloader = asyncio.create_task(self._reload())

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
            if self._runner is not None:
                await self._runner.cleanup()

        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
