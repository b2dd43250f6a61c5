"""KubeClient's configuration over the wire: credentials reach the apiserver, and the environment (proxy
variables, netrc) is read once at connect time, not on a worker thread per request."""

from __future__ import annotations

import asyncio
import json

from fairgpu.k8s.client import KubeClient
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
