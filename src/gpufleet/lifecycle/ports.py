"""The narrow ports the controller's collaborators are handed, so their reach shows in the code.

Every collaborator of :class:`~gpufleet.lifecycle.controller.Controller` gets
only what it may use (docs/decisions/0140). The one Kubernetes client
implements all of these; typing a collaborator's parameter with one of them
makes mypy refuse a call outside it. Who may reach a BMC is not a port here:
only the gate (:mod:`gpufleet.gate`) holds a power driver, and only the gated
steps and the boot watchdog hold the gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpufleet.kubeapi import Json, ObjectList, Patch, Resource


class PodPort(Protocol):
    """What the drain loop does with pods: list a node's, evict, delete."""

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList: ...

    async def evict(self, namespace: str, name: str) -> None: ...

    async def delete(
        self, resource: Resource, name: str, *, namespace: str | None = None
    ) -> None: ...


class ReadPort(Protocol):
    """Reads only (get and list)."""

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json: ...

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList: ...


class WritePort(ReadPort, Protocol):
    """Reads, creates, merge patches and deletes of objects (no eviction, no binding)."""

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json: ...

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Mapping[str, Any],
        *,
        namespace: str | None = None,
        status: bool = False,
        kind: Patch = Patch.MERGE,
    ) -> Json: ...

    async def delete(
        self, resource: Resource, name: str, *, namespace: str | None = None
    ) -> None: ...
