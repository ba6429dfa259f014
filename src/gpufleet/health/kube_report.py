"""Reporting to Kubernetes through :mod:`gpufleet.kubeapi`: Node conditions, the agent's
two Node annotations, and Node Events.

The agent's only Kubernetes access. Conditions are written with a
strategic-merge patch on the Node's ``status`` subresource, which merges by
condition ``type``: the agent touches only its own condition types and
leaves the kubelet's (or KWOK's) alone. ``lastTransitionTime`` changes only
when the status does. The annotations (hardware, request answers:
:mod:`gpufleet.domain.node_reports`) go through the same subresource, the only
Node write the agent has; admission lets it change those two keys and no other
metadata. RBAC: ``deploy/rbac/agent.yaml``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpufleet.domain import well_known
from gpufleet.domain.conditions import ConditionReport
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.faults import FaultEvent
from gpufleet.domain.node_reports import LEGACY_CONDITIONS, AnnotationReport
from gpufleet.kubeapi import NODES, PODS, KubeApi, KubePort, Patch
from gpufleet.kubeapi.events import event_body

log = logging.getLogger(__name__)
COMPONENT = well_known.AGENT


class KubeReporter:
    """Writes one node's conditions and Events."""

    def __init__(
        self, node: str, *, kubeconfig: str | None = None, api: KubePort | None = None
    ) -> None:
        self.node = node
        self.kubeconfig = kubeconfig
        self._api: KubePort | None = api
        self._uid: str | None = None

    async def _connect(self) -> KubePort:
        if self._api is None:
            self._api = await KubeApi.connect(self.kubeconfig)
        return self._api

    async def connect(self) -> KubePort:
        """The agent's API connection (shared with what else the agent reads: its policy)."""
        return await self._connect()

    async def _node(self) -> dict[str, Any]:
        api = await self._connect()
        body = await api.get(NODES, self.node)
        self._uid = body["metadata"].get("uid")
        return body

    async def set_conditions(self, reports: list[ConditionReport], now: float) -> None:
        """Write these conditions (transition time kept when the status is unchanged)."""
        if not reports:
            return
        node = await self._node()
        existing = {c.get("type"): c for c in node.get("status", {}).get("conditions") or []}
        conditions = []
        for r in reports:
            old = existing.get(r.type)
            changed = old is None or old.get("status") != r.status
            conditions.append(
                {
                    "type": r.type,
                    "status": r.status,
                    "reason": r.reason,
                    "message": r.message,
                    "lastHeartbeatTime": rfc3339(now),
                    "lastTransitionTime": rfc3339(now)
                    if changed or old is None
                    else old["lastTransitionTime"],
                }
            )
        api = await self._connect()
        await api.patch(
            NODES,
            self.node,
            {"status": {"conditions": conditions}},
            status=True,
            kind=Patch.STRATEGIC,
        )

    async def set_annotations(self, reports: list[AnnotationReport], now: float) -> None:
        """Write the agent's annotations; remove the conditions that carried them before."""
        if not reports:
            return
        api = await self._connect()
        await api.patch(
            NODES,
            self.node,
            {
                "metadata": {"annotations": {r.key: r.value for r in reports}},
                "status": {
                    "conditions": [{"type": t, "$patch": "delete"} for t in LEGACY_CONDITIONS]
                },
            },
            status=True,
            kind=Patch.STRATEGIC,
        )

    async def set_labels(self, labels: Mapping[str, str | None]) -> None:
        """Set (or, for None, remove) the agent's own Node labels: the NVLink
        topology ones (:data:`~gpufleet.domain.well_known.LABEL_NVLINK_CLIQUE`).
        Through the status subresource, the only part of Nodes the agent may patch."""
        if not labels:
            return
        api = await self._connect()
        await api.patch(
            NODES,
            self.node,
            {"metadata": {"labels": dict(labels)}},
            status=True,
            kind=Patch.MERGE,
        )

    async def event(
        self, fault: FaultEvent, *, reason: str, message: str, now: float, warning: bool = True
    ) -> None:
        """Create one core/v1 Event on the Node about a fault."""
        await self.node_event(
            reason=reason, message=message, now=now, first=fault.at, warning=warning
        )

    async def node_object(self) -> dict[str, Any]:
        """This Node as the apiserver has it now (the agent reads its record and
        Slurm work report from it before it carries out a request)."""
        return await self._node()

    async def pods_on_node(self) -> list[dict[str, Any]]:
        """Every pod bound to this node (RBAC: list pods; a field selector cannot
        be expressed in RBAC, so the permission is cluster-wide read)."""
        api = await self._connect()
        return (await api.list(PODS, field_selector=f"spec.nodeName={self.node}")).items

    async def node_event(
        self,
        *,
        reason: str,
        message: str,
        now: float,
        first: float | None = None,
        warning: bool = True,
    ) -> None:
        """Create one core/v1 Event on the Node."""
        if self._uid is None:
            await self._node()
        api = await self._connect()
        body = event_body(
            involved={"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self._uid},
            type_="Warning" if warning else "Normal",
            reason=reason,
            message=message,
            component=COMPONENT,
            instance=self.node,
            namespace="default",
            first=rfc3339(now if first is None else first),
            last=rfc3339(now),
            name=f"{self.node}.{int(now * 1e6):x}",
            host=self.node,
            max_message=1024,
        )
        await api.create_event("default", body)

    async def watch_requests(
        self, offer: Callable[[dict[str, Any]], None], *, backoff: float = 2.0
    ) -> None:
        """Watch this Node and offer every version of it (the agent reads the request
        annotation and the controller's ``gpufleet.io/faults-seen`` watermark from it).

        Runs until cancelled; a broken watch is re-opened after ``backoff`` seconds.
        """
        selector = f"metadata.name={self.node}"
        while True:
            try:
                api = await self._connect()
                listing = await api.list(NODES, field_selector=selector)
                for obj in listing.items:
                    offer(obj)
                async for event in api.watch(
                    NODES, listing.resource_version, field_selector=selector
                ):
                    offer(event.object)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("node=%s watch of own Node failed: %s", self.node, exc)
            await asyncio.sleep(backoff)

    async def close(self) -> None:
        self._api = None
