"""Session 13 (safe10): a client that sends slowly (slowloris), or holds many connections, cannot run the
webhook out of descriptors. Any pod can reach it and every GPU pod's creation waits on it (failurePolicy Fail);
it shares its process with the scheduler."""

from __future__ import annotations

import json
import resource
import socket
import ssl
import sys
import time
from collections.abc import Callable

import pytest

from fairgpu.k8s.webhook import webhook_app
from fairgpu.k8s.webhook_server import WebhookServer
from test_webhook import QUEUES, TRUST, gpu_pod, post, review

ARRIVAL = 0.3  # seconds a request may take to arrive, here


def serve(tls: tuple[str, str], **kw) -> WebhookServer:
    return WebhookServer(lambda: webhook_app(QUEUES.get, "fairgpu", TRUST), "127.0.0.1", 0, *tls, **kw).start()


def connect(server: WebhookServer, cafile: str, handshake: bool = True) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=2)
    if not handshake:
        return raw
    return ssl.create_default_context(cafile=cafile).wrap_socket(raw, server_hostname="127.0.0.1")


def closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes the connection within `within` seconds (it never sends unasked, but for TLS
    session tickets, which recv reads past)."""
    sock.settimeout(max(within, 0.01))
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except (OSError, ssl.SSLError):
        return True
    finally:
        sock.settimeout(2)


def wait(cond: Callable[[], bool], within: float = 1.0) -> bool:
    deadline = time.monotonic() + within
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


def request(body: bytes) -> bytes:
    head = "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def answer(server: WebhookServer, cafile: str) -> dict:
    return post(server, "/validate", review(gpu_pod({"nvidia.com/gpu": "1"})), cafile)["response"]


@pytest.mark.parametrize("phase", ["handshake", "headers", "body"])
def test_a_request_that_arrives_too_slowly_is_cut_off_while_others_are_answered(tls, phase):
    """Before: no bound on a TLS handshake (60 s), on a request's headers or on its body (none): a client
    sending a byte now and then held its connection, and its descriptor, for as long as it liked."""
    server = serve(tls, arrival=ARRIVAL)
    try:
        wire = request(json.dumps(review(gpu_pod({"nvidia.com/gpu": "1"}))).encode())
        sock = connect(server, tls[0], handshake=phase != "handshake")
        start, sent = time.monotonic(), 0
        if phase == "body":
            sent = wire.index(b"\r\n\r\n") + 4
            sock.sendall(wire[:sent])  # headers at once, then the body byte by byte
        done = False
        while time.monotonic() - start < 2 and not done:
            if phase != "handshake":
                sock.sendall(wire[sent : sent + 1])
                sent += 1
            done = closed(sock, 0.05)
        took = time.monotonic() - start
        assert done, f"{phase}: still open after {took:.1f} s"
        assert ARRIVAL <= took < ARRIVAL + 0.5, took
        assert sent < len(wire)  # cut before it had all arrived
        assert wait(lambda: not server.connections.open)  # its descriptor is freed
        assert "allowed" in answer(server, tls[0])  # and others are answered
    finally:
        server.stop()


def test_connections_beyond_the_limit_are_closed_at_once_and_the_room_comes_back(tls):
    """At most `max_connections` (by default half the process's descriptors, leaving the scheduler its own);
    one more is closed at once; a request is answered again once one of them goes."""
    server = serve(tls, max_connections=2)
    try:
        held = [connect(server, tls[0]) for _ in range(2)]
        extra = connect(server, tls[0])
        assert closed(extra, 1.0)
        assert server.connections.refused == 1
        held.pop().close()
        assert wait(lambda: len(server.connections.open) == 1)
        assert "allowed" in answer(server, tls[0])
        assert not closed(held[0], 0.0)  # an idle connection is left to the client to close
    finally:
        server.stop()


@pytest.mark.parametrize(("soft", "limit"), [(1024, 512), (resource.RLIM_INFINITY, sys.maxsize)])
def test_the_default_limit_is_half_the_descriptors_and_none_when_they_are_unlimited(tls, monkeypatch, soft, limit):
    """Unlimited descriptors (RLIM_INFINITY is -1) must not make the limit -1, which refused every connection.
    The soft limit is the one the process runs out at, whatever the hard one (unlimited here)."""
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, resource.RLIM_INFINITY))
    server = serve(tls)
    try:
        assert server.connections.limit == limit
        assert "allowed" in answer(server, tls[0])
    finally:
        server.stop()


def test_a_kept_alive_connection_whose_request_arrived_in_time_is_left_open_past_the_bound(tls):
    """A request answered, its connection kept alive (as the API server's client does) and idle past `arrival`:
    still open, and it is answered again. Catches the deadline re-armed while one is pending (`and` -> `or` in
    `expect`): the first timer, no longer held, then cut every connection `arrival` after its first request."""
    server = serve(tls, arrival=ARRIVAL)
    try:
        sock = connect(server, tls[0])
        wire = request(json.dumps(review(gpu_pod({"nvidia.com/gpu": "1"}))).encode())
        for idle in (ARRIVAL + 0.2, 0.0):
            sock.sendall(wire)
            got = b""
            while b'"allowed"' not in got:
                chunk = sock.recv(65536)
                assert chunk, "closed before the answer"
                got += chunk
            assert got.startswith(b"HTTP/1.1 200")
            assert not closed(sock, idle)
        assert len(server.connections.open) == 1
    finally:
        server.stop()


def test_a_pipelined_request_whose_bytes_came_with_the_one_before_is_bounded_too(tls):
    """Two requests in one write, the second's body cut short: the first is answered, and the connection is
    closed `arrival` later, the second never having arrived. Catches the middleware not setting the deadline
    (`conn is not None` -> `is None`): the first's arrival cancelled the one its bytes set, and nothing else
    would, so the second's body could be awaited for as long as the client liked."""
    server = serve(tls, arrival=ARRIVAL)
    try:
        sock = connect(server, tls[0])
        wire = request(json.dumps(review(gpu_pod({"nvidia.com/gpu": "1"}))).encode())
        start = time.monotonic()
        sock.sendall(wire + wire[:-10])
        got = b""
        while b'"allowed"' not in got:
            chunk = sock.recv(65536)
            assert chunk, "closed before the first answer"
            got += chunk
        assert closed(sock, 1.0)
        assert ARRIVAL <= time.monotonic() - start < ARRIVAL + 0.5
    finally:
        server.stop()


def test_a_stopped_server_takes_no_connection(tls):
    """Catches `stop` leaving the listening socket open (`self._server is not None` -> `is None`): the kernel
    would then accept connections no one answers, and an API server would wait out its timeout on each."""
    server = serve(tls)
    port = server.port
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
