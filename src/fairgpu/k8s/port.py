"""The narrow async port the controller talks through: generic verbs on a handful of kinds, plus bind and
evict. Objects are plain JSON dicts; failures are KubeError with the API's code and reason."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True, frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
        if sub is not None:
            base += f"/{sub}"
        return base


PODS = Kind("", "v1", "pods", True)
NODES = Kind("", "v1", "nodes", False)
EVENTS = Kind("", "v1", "events", True)
LEASES = Kind("coordination.k8s.io", "v1", "leases", True)
QUEUES = Kind("fairgpu.io", "v1alpha1", "queues", False)
TOKEN_REVIEWS = Kind("authentication.k8s.io", "v1", "tokenreviews", False)
SUBJECT_ACCESS_REVIEWS = Kind("authorization.k8s.io", "v1", "subjectaccessreviews", False)


class KubePort(Protocol):
    async def list(
        self, kind: Kind, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[dict], str]:
        """Items and the list's resourceVersion."""
        ...

    def watch(
        self, kind: Kind, resource_version: str, timeout_seconds: int = 300, field_selector: str = ""
    ) -> AsyncIterator[dict]:
        """Watch events ({"type", "object"}) from that revision, bookmarks on; ends when the server closes."""
        ...

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict: ...

    async def create(self, kind: Kind, body: dict, namespace: str | None = None) -> dict: ...

    async def replace(self, kind: Kind, name: str, body: dict, namespace: str | None = None) -> dict: ...

    async def patch(
        self, kind: Kind, name: str, body: dict, namespace: str | None = None, subresource: str | None = None
    ) -> dict:
        """A JSON merge patch; a metadata.resourceVersion in the body makes it conditional (409 if stale)."""
        ...

    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        """POST a Binding; the apiserver merges `annotations` into the pod in the same write."""
        ...

    async def evict(self, namespace: str, name: str, grace_seconds: int | None = None, uid: str | None = None) -> None:
        """POST an Eviction; `grace_seconds` overrides the pod's termination grace period. 429: a disruption
        budget refuses it (not rate limiting). `uid`: a precondition, 409 if the pod by that name is another."""
        ...

    async def reconnect(self) -> KubePort:
        """A client of its own (session, connection pool) to the same server as the same user and agent, for
        the event loop that calls this (a session belongs to the loop it was made on)."""
        ...

    async def close(self) -> None: ...
