"""An in-memory :class:`~gpufleet.kubeapi.KubePort` for the syncer's unit tests.

The syncer writes Nodes (strategic-merge patches) and reads Pods; this fake
records the Node patches, answers Pod reads from ``pods`` (NotFound when there
is none) and the lender's access reviews, refuses every write with Forbidden
when ``refuse`` is set, and raises NotImplementedError for calls it does not
model, so a test never passes because a call silently did nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.kubeapi import (
    NODES,
    PODS,
    Forbidden,
    Json,
    KubePort,
    NotFound,
    Patch,
    Resource,
)

from ..fakes import UnmodelledKube


class RecordingKube(UnmodelledKube):
    def __init__(self) -> None:
        self.refuse = False
        self.pods: dict[str, Json] = {}
        """Pods by ``namespace/name``."""
        self.patches: list[tuple[str, Json]] = []
        """Node patches as sent, status patches included: (node name, patch)."""
        self.no_binding: set[str] = set()
        """Namespaces where RBAC refuses the syncer ``pods/binding``."""

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        if resource == PODS:
            pod = self.pods.get(f"{namespace}/{name}")
            if pod is None:
                raise NotFound(f"get {resource} {namespace}/{name}", 404, "not found")
            return pod
        raise NotImplementedError(f"get {resource}")

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

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        """A SelfSubjectAccessReview (the lender asks whether it may bind in a namespace):
        allowed unless the namespace is in ``no_binding``."""
        if body.get("kind") != "SelfSubjectAccessReview":
            raise NotImplementedError(f"create {resource}")
        ns = body["spec"]["resourceAttributes"].get("namespace")
        return {**body, "status": {"allowed": ns not in self.no_binding}}


_: type[KubePort] = RecordingKube  # mypy checks the fake against the port
