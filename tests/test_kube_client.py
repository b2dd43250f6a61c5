"""KubeClient over the wire: credentials reach the apiserver, the environment (proxy variables, netrc) is
read once at connect time, not on a worker thread per request, and an API server that does not answer is a
KubeError like any other failure."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from fairgpu.errors import KubeError
from fairgpu.k8s.client import UNREACHABLE, KubeClient
from fairgpu.k8s.port import NODES


def kubeconfig(path, server: str, user: dict) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(json.dumps(doc))
    return str(path)


def test_bearer_token_reaches_the_apiserver(fake_api, tmp_path):
    fake_api.token("s3cret", username="ops", groups=["system:masters"])  # an unknown token would be a 401

    async def go() -> None:
        port = await KubeClient.connect(kubeconfig(tmp_path / "kc", fake_api.url, {"token": "s3cret"}))
        await port.list(NODES)
        await port.close()

    asyncio.run(go())
    assert "Bearer s3cret" in fake_api.api.state.credentials


def test_proxy_variables_read_once_and_no_proxy_honoured(fake_api, tmp_path, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    kc = kubeconfig(tmp_path / "kc", fake_api.url, {})

    async def proxied() -> tuple[str | None, bool]:
        port = await KubeClient.connect(kc)
        rest = port.api.rest_client
        await port.close()
        return rest.proxy, rest.pool_manager.trust_env

    assert asyncio.run(proxied()) == ("http://proxy.invalid:3128", False)

    monkeypatch.setenv("NO_PROXY", "127.0.0.1")

    async def direct() -> str | None:
        port = await KubeClient.connect(kc)
        await port.list(NODES)  # reaches the fake directly
        proxy = port.api.rest_client.proxy
        await port.close()
        return proxy

    assert asyncio.run(direct()) is None


def test_no_answer_is_a_kube_error_even_mid_stream(tmp_path):
    """Refused connections, and a watch stream the server tears off mid-way (aiohttp's error there is no
    OSError), reach the caller as KubeError, which informers retry."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    event = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "n", "resourceVersion": "2"}}}).encode()

    async def torn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        writer.write(head + f"{len(event) + 1:x}\r\n".encode() + event + b"\n\r\n")
        await writer.drain()
        writer.close()  # no last chunk: the stream is cut short

    async def go() -> None:
        port = await KubeClient.connect(kubeconfig(tmp_path / "kc", dead, {}))
        port.backoff = 0.001
        with pytest.raises(KubeError) as err:
            await port.list(NODES)
        assert err.value.code == UNREACHABLE and "Connect" in err.value.message
        await port.close()
        server = await asyncio.start_server(torn, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        port = await KubeClient.connect(kubeconfig(tmp_path / "kc2", url, {}))
        got = []
        with pytest.raises(KubeError) as err:
            async for ev in port.watch(NODES, "1"):
                got.append(ev)
        assert err.value.code == UNREACHABLE and got == [json.loads(event)]
        await port.close()
        server.close()
        await server.wait_closed()

    asyncio.run(asyncio.wait_for(go(), 30))
