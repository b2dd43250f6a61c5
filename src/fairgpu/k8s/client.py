"""KubePort on kubernetes-asyncio: its configuration (kubeconfig or in-cluster), auth and HTTP machinery,
with JSON read raw (`_preload_content=False`) so objects stay plain dicts and binding's Status reply, which
the typed client cannot decode, is read by hand (design/fake-apiserver.md §5)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
from kubernetes_asyncio import client, config

from fairgpu.errors import KubeError
from fairgpu.k8s.port import PODS, Kind

MERGE_PATCH = "application/merge-patch+json"
UNREACHABLE = 0  # KubeError code when no answer came back: connection refused or reset, or a timeout
RETRIED = (UNREACHABLE, 500, 503, 504)  # transient failures: back off exponentially, a few times
ATTEMPTS = 5


CONNECTIONS = 128  # concurrent requests to the API server (binds run in parallel, one node lock each)
READ_BUFFER = 2**21  # watch events of large objects exceed aiohttp's default buffer (kubernetes-asyncio's value)
AUTH = ["BearerToken"]  # the only scheme kubernetes-asyncio's configuration knows; absent when certs are used


class KubeClient:
    def __init__(self, api: client.ApiClient, backoff: float = 0.05) -> None:
        self.api = api
        self.backoff = backoff

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> KubeClient:
        """From a kubeconfig file, or the pod's service account when none is given."""
        conf = client.Configuration()
        # The default pool is 5 connections per CPU: on a 2-core node that caps concurrent binds at 10.
        conf.connection_pool_maxsize = CONNECTIONS
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=conf)
        else:
            config.load_incluster_config(client_configuration=conf)
        api = client.ApiClient(configuration=conf)
        _read_environment_once(api.rest_client, conf.host or "")
        return cls(api)

    async def reconnect(self) -> KubeClient:
        api = client.ApiClient(configuration=self.api.configuration)
        api.default_headers.update(self.api.default_headers)  # its User-Agent among them
        _read_environment_once(api.rest_client, self.api.configuration.host or "")
        return KubeClient(api, self.backoff)

    async def close(self) -> None:
        await self.api.close()

    async def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = "application/json",
        retry: bool = True,
    ) -> dict:
        for attempt in range(ATTEMPTS):
            retry_after = None
            try:
                resp = await self.api.call_api(
                    path,
                    method,
                    query_params=query or [],
                    header_params={"Accept": "application/json", "Content-Type": content_type},
                    body=body,
                    auth_settings=AUTH,
                    _preload_content=False,
                    _request_timeout=30,
                )
                raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                err = _unreachable(exc)
            else:
                if 200 <= resp.status < 300:
                    return json.loads(raw) if raw else {}
                err, retry_after = _error(resp.status, raw), resp.headers.get("Retry-After")
            last = attempt == ATTEMPTS - 1
            if retry and not last and err.code in RETRIED:
                await asyncio.sleep(self.backoff * 2**attempt)
                continue
            if retry and not last and err.code == 429 and retry_after is not None:
                await asyncio.sleep(float(retry_after))
                continue
            raise err
        raise AssertionError("unreachable")  # the loop returns or raises

    async def list(
        self, kind: Kind, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[dict], str]:
        query = [(k, v) for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v]
        doc = await self._call("GET", kind.path(namespace), query)
        return doc.get("items") or [], doc["metadata"]["resourceVersion"]

    async def watch(
        self, kind: Kind, resource_version: str, timeout_seconds: int = 300, field_selector: str = ""
    ) -> AsyncIterator[dict]:
        query = [
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        try:
            resp = await self.api.call_api(
                kind.path(),
                "GET",
                query_params=query,
                header_params={"Accept": "application/json"},
                auth_settings=AUTH,
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=None, sock_read=timeout_seconds + 30),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(exc) from exc
        try:
            if resp.status != 200:
                raise _error(resp.status, await resp.read())
            while line := await resp.content.readline():
                if line.strip():
                    yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError) as exc:  # the stream was torn (server gone, reset)
            raise _unreachable(exc) from exc
        finally:
            resp.release()

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict:
        return await self._call("GET", kind.path(namespace, name))

    async def create(self, kind: Kind, body: dict, namespace: str | None = None) -> dict:
        return await self._call("POST", kind.path(namespace), body=body, retry=False)

    async def replace(self, kind: Kind, name: str, body: dict, namespace: str | None = None) -> dict:
        return await self._call("PUT", kind.path(namespace, name), body=body, retry=False)

    async def patch(
        self, kind: Kind, name: str, body: dict, namespace: str | None = None, subresource: str | None = None
    ) -> dict:
        return await self._call("PATCH", kind.path(namespace, name, subresource), body=body, content_type=MERGE_PATCH)

    async def delete(
        self, kind: Kind, name: str, namespace: str | None = None, grace_seconds: int | None = None
    ) -> dict:
        query = [("gracePeriodSeconds", str(grace_seconds))] if grace_seconds is not None else None
        return await self._call("DELETE", kind.path(namespace, name), query)

    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        # Retrying after a 5xx is safe: if the first attempt landed, the retry gets 409 "already assigned".
        await self._call("POST", PODS.path(namespace, name, "binding"), body=body)

    async def evict(self, namespace: str, name: str, grace_seconds: int | None = None, uid: str | None = None) -> None:
        body: dict = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        options: dict = {}
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        if uid:  # only this pod: never a new one created under the same name meanwhile
            options["preconditions"] = {"uid": uid}
        if options:
            body["deleteOptions"] = options
        # 429 here is a disruption budget, not rate limiting: the caller picks another victim.
        await self._call("POST", PODS.path(namespace, name, "eviction"), body=body, retry=False)


def _read_environment_once(rest: client.rest.RESTClientObject, host: str) -> None:
    """kubernetes-asyncio's session trusts the environment, so aiohttp looks up the proxy variables and reads
    ~/.netrc on a worker thread for every request: at hundreds of binds a second that was a third of the
    scheduler's CPU. client-go reads the proxy variables once and never netrc; so does this: the proxy the
    environment names for the API server (NO_PROXY honoured) is fixed now, unless the kubeconfig named one."""
    if not rest.proxy:
        where = urlsplit(host)
        if where.hostname and not urllib.request.proxy_bypass(where.hostname):
            rest.proxy = urllib.request.getproxies().get(where.scheme)  # type: ignore[assignment]  # None: no proxy
    session = rest.pool_manager
    connector = session.connector
    session.detach()  # hand its connection pool (TLS settings, size) over without closing it
    rest.pool_manager = aiohttp.ClientSession(connector=connector, trust_env=False, read_bufsize=READ_BUFFER)


def _unreachable(exc: BaseException) -> KubeError:
    """No answer from the API server is a KubeError too, so callers handle one kind of failure (aiohttp's
    own, such as a server that disconnects mid-stream, are not all OSErrors)."""
    return KubeError(UNREACHABLE, "Unreachable", f"{type(exc).__name__}: {exc}")


def _error(code: int, raw: bytes) -> KubeError:
    try:
        status = json.loads(raw)
        return KubeError(code, str(status.get("reason", "")), str(status.get("message", "")))
    except (ValueError, AttributeError):
        return KubeError(code, "", raw.decode(errors="replace")[:200])
