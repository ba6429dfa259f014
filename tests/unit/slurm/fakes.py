"""An in-memory :class:`~gpufleet.kubeapi.KubePort` for the syncer's unit tests.

The syncer writes Nodes (strategic-merge patches) and reads Pods; this fake
records the Node patches, answers Pod reads from ``pods`` (NotFound when there
is none), refuses every write with Forbidden when ``refuse`` is set, and raises
NotImplementedError for calls it does not model, so a test never passes because
a call silently did nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from gpufleet.kubeapi import (
    NODES,
    PODS,
    Forbidden,
    Json,
    KubePort,
    NotFound,
    ObjectList,
    Patch,
    Resource,
    WatchEvent,
)


class RecordingKube:
    def __init__(self) -> None:
        self.refuse = False
        self.pods: dict[str, Json] = {}
        """Pods by ``namespace/name``."""
        self.patches: list[tuple[str, Json]] = []
        """Node patches as sent, status patches included: (node name, patch)."""

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        if resource == PODS:
            pod = self.pods.get(f"{namespace}/{name}")
            if pod is None:
                raise NotFound(f"get {resource} {namespace}/{name}", 404, "not found")
            return pod
        raise NotImplementedError(f"get {resource}")

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        raise NotImplementedError(f"list {resource}")

    async def watch(
        self,
        resource: Resource,
        resource_version: str,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
        bookmarks: bool = False,
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        raise NotImplementedError(f"watch {resource}")
        yield WatchEvent("", {})  # pragma: no cover  (makes this an async generator)

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        raise NotImplementedError(f"create {resource}")

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        status: bool = False,
        kind: Patch = Patch.MERGE,
    ) -> Json:
        if resource != NODES:
            raise NotImplementedError(f"patch {resource}")
        if self.refuse:
            raise Forbidden(f"patch {resource} {name}", 403, "forbidden")
        self.patches.append((name, dict(patch)))
        return {}

    async def apply(
        self,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        field_manager: str = "gpufleet",
    ) -> Json:
        raise NotImplementedError(f"apply {resource}")

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        raise NotImplementedError(f"delete {resource}")

    async def delete_all(self, resource: Resource, *, namespace: str, label_selector: str) -> None:
        raise NotImplementedError(f"delete_all {resource}")

    async def evict(self, namespace: str, name: str) -> None:
        raise NotImplementedError("evict")

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        raise NotImplementedError("bind")

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        raise NotImplementedError("create_event")


_: type[KubePort] = RecordingKube  # mypy checks the fake against the port
