"""The fake apiserver in a process of its own, for runs that measure the scheduler's timing across it (the chaos
soak): in the scheduler's process, a CPU-starved interpreter answered lease renewals late for the fake's sake,
and the soak counted that against the scheduler. The driver reaches it over HTTP like any client, and over a
pipe for `apply`, which runs a picklable function (a module-level one) on the fake's loop in that process."""

from __future__ import annotations

import multiprocessing
import threading
from multiprocessing.connection import Connection

from .server import FakeApiServer, FakeEndpoint

START_S = 60.0  # a spawned interpreter imports aiohttp and the fake: seconds on a loaded machine


def _serve(conn: Connection, namespaces: tuple[str, ...]) -> None:
    server = FakeApiServer(namespaces=namespaces).start()
    conn.send(server.url)
    try:
        while (msg := conn.recv()) is not None:
            fn, args, timeout = msg
            try:
                conn.send((True, server.apply(fn, *args, timeout=timeout)))
            except Exception as err:  # the caller's to see, with the fake still serving
                conn.send((False, err))
    except EOFError:  # the driver is gone
        pass
    finally:
        server.stop()


class FakeProcess(FakeEndpoint):
    """A FakeApiServer run by a spawned process; `stop()` ends it (it ends too when this process does)."""

    def __init__(self, namespaces: tuple[str, ...] = ()) -> None:
        ctx = multiprocessing.get_context("spawn")  # not fork: this process may run threads already
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, namespaces), name="fakeapi", daemon=True)
        self._lock = threading.Lock()  # one request on the pipe at a time
        self._url = ""
        self._lost = False  # a call timed out: its late answer would be read as the next call's

    @property
    def url(self) -> str:
        return self._url

    def start(self) -> FakeProcess:
        self._proc.start()
        if not self._conn.poll(START_S):
            self._proc.kill()
            raise TimeoutError(f"the fake apiserver's process did not start within {START_S:g} s")
        self._url = self._conn.recv()
        return self

    def apply(self, fn, *args, timeout: float = 10.0):
        with self._lock:
            if self._lost:
                raise RuntimeError("the fake's process lost an earlier call and is out of step")
            self._conn.send((fn, args, timeout))
            if not self._conn.poll(timeout + 5):
                self._lost = True
                raise TimeoutError(f"the fake's process did not answer {fn.__qualname__} within {timeout:g} s")
            ok, value = self._conn.recv()
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        if self._proc.is_alive():
            try:
                with self._lock:
                    self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._proc.join(15)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
        self._conn.close()
