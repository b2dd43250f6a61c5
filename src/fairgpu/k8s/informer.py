"""Informer: list → watch with bookmarks → relist on 410, keeping a cache and reporting every change.

A relist is diffed against the cache, so objects deleted while the watch was down are reported as
DELETED, as client-go's Replace does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from fairgpu.errors import KubeError
from fairgpu.k8s.port import Kind, KubePort

log = logging.getLogger(__name__)
Handler = Callable[[str, dict], None]  # ("ADDED" | "MODIFIED" | "DELETED", object)


def object_key(obj: dict) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


class Informer:
    def __init__(
        self, port: KubePort, kind: Kind, handler: Handler, watch_timeout: int = 300, max_backoff: float = 2.0
    ) -> None:
        self.port = port
        self.kind = kind
        self.handler = handler
        self.cache: dict[str, dict] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.watch_timeout = watch_timeout
        self.max_backoff = max_backoff
        self.relists = 0
        self.rewatches = 0
        self.healthy = False  # listed, and not failed since
        self._replay = False
        self._resync = asyncio.Event()
        self._resyncs: list[asyncio.Future[None]] = []

    async def run(self) -> None:
        """Supervised: a failure the loop does not expect (a handler's bug, a malformed object) is logged and
        the informer starts over with a fresh list; `healthy` is False from the failure until that list."""
        backoff = 0.05
        while True:
            try:
                await self._run()
            except Exception:
                self.healthy = False
                self._replay = True  # the handler may have missed the object it failed on: report all again
                log.exception("%s informer failed; starting over in %.2fs", self.kind.plural, backoff)
                await asyncio.sleep(backoff)
                backoff = min(self.max_backoff, backoff * 2)

    async def resync(self) -> None:
        """List again now and return once the cache holds that list (a new leader's view must include every
        write made before its term began, not only what the watch has delivered so far)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._resyncs.append(done)
        self._resync.set()
        await done

    async def _run(self) -> None:
        backoff = 0.05
        need_list = True
        while True:
            try:
                if need_list or self._resync.is_set():
                    # Those who asked are answered only by a list that succeeded (a failed one is retried).
                    waiting = list(self._resyncs)
                    self._resync.clear()
                    need_list = True
                    await self._relist()
                    self._resyncs = [d for d in self._resyncs if d not in waiting]
                    self.healthy = True
                    for done in waiting:
                        if not done.done():
                            done.set_result(None)
                    need_list = False
                need_list = await self._watch_until_resync()
                self.rewatches += 1
                backoff = 0.05
            except KubeError as err:
                need_list = need_list or err.code == 410
                log.warning("%s informer: %s; retrying in %.2fs", self.kind.plural, err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(self.max_backoff, backoff * 2)
            except (TimeoutError, OSError, ValueError) as err:  # connection trouble, torn stream
                log.warning("%s informer: %r; retrying in %.2fs", self.kind.plural, err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(self.max_backoff, backoff * 2)

    async def _watch_until_resync(self) -> bool:
        watch = asyncio.ensure_future(self._watch())
        asked = asyncio.ensure_future(self._resync.wait())
        try:
            await asyncio.wait({watch, asked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (watch, asked):
                if not t.done():
                    t.cancel()
            await asyncio.gather(asked, return_exceptions=True)
        if not watch.done() or watch.cancelled():
            await asyncio.gather(watch, return_exceptions=True)
            return True  # a resync was asked for
        return watch.result()

    async def _relist(self) -> None:
        items, rv = await self.port.list(self.kind)
        self.relists += 1
        fresh = {object_key(o): o for o in items}
        for key in [k for k in self.cache if k not in fresh]:
            self.handler("DELETED", self.cache.pop(key))
        for key, obj in fresh.items():
            old = self.cache.get(key)
            self.cache[key] = obj
            if old is None:
                self.handler("ADDED", obj)
            elif self._replay or old["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                self.handler("MODIFIED", obj)
        self._replay = False
        self.resource_version = rv
        self.synced.set()

    async def _watch(self) -> bool:
        """Stream events until the server closes; True if the history is gone and a relist is needed."""
        async for event in self.port.watch(self.kind, self.resource_version, self.watch_timeout):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if obj.get("code") in (410, 504) or obj.get("reason") in ("Expired", "Gone"):
                    return True
                raise KubeError(int(obj.get("code") or 500), str(obj.get("reason")), str(obj.get("message")))
            rv = obj.get("metadata", {}).get("resourceVersion")
            if rv:
                self.resource_version = rv
            if kind == "BOOKMARK":
                continue
            key = object_key(obj)
            if kind == "DELETED":
                self.cache.pop(key, None)
            else:
                self.cache[key] = obj
            self.handler(str(kind), obj)
        return False
