"""Reporting to Kubernetes with kr8s: Node conditions and Node Events.

The only module that imports kr8s. Conditions are written with a
strategic-merge patch on the Node's ``status`` subresource, which merges by
condition ``type``: the agent touches only its own condition types and
leaves the kubelet's (or KWOK's) alone. ``lastTransitionTime`` changes only
when the status does. RBAC: ``deploy/rbac/agent.yaml``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from gpufleet.domain.conditions import ConditionReport
from gpufleet.domain.faults import FaultEvent

log = logging.getLogger(__name__)
COMPONENT = "gpufleet-agent"


def _ts(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeReporter:
    """Writes one node's conditions and Events."""

    def __init__(self, node: str, *, kubeconfig: str | None = None) -> None:
        self.node = node
        self.kubeconfig = kubeconfig
        self._api: Any = None
        self._uid: str | None = None

    async def _connect(self) -> Any:
        if self._api is None:
            import kr8s.asyncio

            self._api = await kr8s.asyncio.api(kubeconfig=self.kubeconfig)
        return self._api

    async def _node(self) -> dict[str, Any]:
        api = await self._connect()
        async with api.call_api("GET", version="v1", url=f"nodes/{self.node}") as resp:
            body: dict[str, Any] = resp.json()
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
                    "lastHeartbeatTime": _ts(now),
                    "lastTransitionTime": _ts(now)
                    if changed or old is None
                    else old["lastTransitionTime"],
                }
            )
        api = await self._connect()
        async with api.call_api(
            "PATCH",
            version="v1",
            url=f"nodes/{self.node}/status",
            content=json.dumps({"status": {"conditions": conditions}}),
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        ):
            pass

    async def event(
        self, fault: FaultEvent, *, reason: str, message: str, now: float, warning: bool = True
    ) -> None:
        """Create one core/v1 Event on the Node."""
        if self._uid is None:
            await self._node()
        api = await self._connect()
        name = f"{self.node}.{int(now * 1e6):x}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": self._uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT, "host": self.node},
            "firstTimestamp": _ts(fault.at),
            "lastTimestamp": _ts(now),
            "count": 1,
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
        }
        async with api.call_api(
            "POST",
            version="v1",
            url="events",
            namespace="default",
            content=json.dumps(body),
            headers={"Content-Type": "application/json"},
        ):
            pass

    async def close(self) -> None:
        self._api = None
