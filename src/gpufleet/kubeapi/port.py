"""The async port to the Kubernetes API that every product depends on.

Products take a :class:`KubePort`; production passes
:class:`~gpufleet.kubeapi.client.KubeApi`, unit tests a fake that mypy checks
against this Protocol. Every method raises :mod:`gpufleet.kubeapi.errors`
only.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.kubeapi.errors import NotFound
from gpufleet.kubeapi.resources import Json, Patch, Resource


@dataclass(frozen=True)
class ObjectList:
    """A list answer: its items and the resourceVersion a watch continues from."""

    items: list[Json] = field(default_factory=list)
    resource_version: str = ""


@dataclass(frozen=True)
class WatchEvent:
    """One watch event: ``ADDED``, ``MODIFIED``, ``DELETED`` or ``BOOKMARK``."""

    type: str
    object: Json


class KubePort(Protocol):
    """The calls gpufleet makes to the apiserver (``namespace`` None: cluster-scoped
    objects, or every namespace for a list/watch)."""

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        """The object; :class:`NotFound` when there is none."""
        ...

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        """Objects matching the selectors (asked of the apiserver, not filtered here)."""
        ...

    def watch(
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
        """Events after ``resource_version`` until the server ends the watch; an object
        that stops matching a selector arrives as ``DELETED``. A too-old version raises
        :class:`~gpufleet.kubeapi.errors.Gone`."""
        ...

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        """Create; :class:`~gpufleet.kubeapi.errors.Conflict` when it exists."""
        ...

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
        """Patch the object (``status``: its status subresource). A merge patch that
        carries ``metadata.resourceVersion`` fails with Conflict if the object changed."""
        ...

    async def apply(
        self,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        field_manager: str = "gpufleet",
    ) -> Json:
        """Server-side apply (forced) under ``field_manager``."""
        ...

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        """Delete; NotFound when there is nothing to delete."""
        ...

    async def delete_all(self, resource: Resource, *, namespace: str, label_selector: str) -> None:
        """Delete every object in ``namespace`` matching ``label_selector``."""
        ...

    async def evict(self, namespace: str, name: str) -> None:
        """Evict a pod through the Eviction API (PodDisruptionBudgets apply:
        :class:`~gpufleet.kubeapi.errors.TooManyRequests`)."""
        ...

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind a pod to a node as a scheduler does; ``uid`` guards against a new pod
        with the same name."""
        ...

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Create a core/v1 Event (background work: it never delays a caller's own
        requests when the client limits requests in flight)."""
        ...


async def get_or_none(
    kube: KubePort, resource: Resource, name: str, *, namespace: str | None = None
) -> Json | None:
    """The object, or None when there is none."""
    with contextlib.suppress(NotFound):
        return await kube.get(resource, name, namespace=namespace)
    return None
