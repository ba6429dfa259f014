"""An in-memory stand-in for KubeClient: Nodes with resourceVersions, merge patches, Events."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpufleet.kube import nodes
from gpufleet.kube.client import Conflict, NotFound


class FakeKube:
    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.custom: dict[tuple[str, str], dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.patches = 0
        self._rv = 0

    def add_node(self, body: dict[str, Any]) -> None:
        self._rv += 1
        body.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        self.nodes[body["metadata"]["name"]] = body

    async def _call(self, what: str, method: str, **kw: Any) -> dict[str, Any]:
        if kw.get("url") == "nodes":
            return {"items": [copy.deepcopy(n) for n in self.nodes.values()]}
        return {"items": []}

    async def get_node(self, name: str) -> dict[str, Any]:
        if name not in self.nodes:
            raise NotFound(f"get node {name}", 404, "not found")
        return copy.deepcopy(self.nodes[name])

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        node = self.nodes[name]
        rv = patch.get("metadata", {}).get("resourceVersion")
        if rv is not None and rv != node["metadata"]["resourceVersion"]:
            raise Conflict(f"patch node {name}", 409, "changed")
        self.patches += 1
        merged = nodes.apply_merge_patch(node, patch)
        self._rv += 1
        merged["metadata"]["resourceVersion"] = str(self._rv)
        self.nodes[name] = merged
        return copy.deepcopy(merged)

    async def pods_on(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"]["nodeName"] == node]

    async def evict(self, namespace: str, name: str) -> None:
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self.evict(namespace, name)

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any]:
        return self.secrets[(namespace, name)]

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self.events.append(dict(event))

    async def create_custom(self, plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
        key = (plural, body["metadata"]["name"])
        if key in self.custom:
            raise Conflict("create", 409, "exists")
        self.custom[key] = copy.deepcopy(dict(body))
        return dict(body)

    async def patch_custom(
        self, plural: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        obj = self.custom.setdefault((plural, name), {"metadata": {"name": name}})
        self.custom[(plural, name)] = nodes.apply_merge_patch(obj, patch)
        return self.custom[(plural, name)]

    async def patch_status(
        self, plural: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        obj = self.custom.setdefault((plural, name), {"metadata": {"name": name}})
        obj["status"] = nodes.apply_merge_patch(obj.get("status") or {}, status)
        return obj


def node(name: str, *, pool: str = "default", unschedulable: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"gpufleet.io/pool": pool},
            "annotations": {},
        },
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def set_condition(body: dict[str, Any], cond: Any) -> None:
    conds = [c for c in body["status"].get("conditions", []) if c["type"] != cond.type]
    conds.append(
        {"type": cond.type, "status": cond.status, "reason": cond.reason, "message": cond.message}
    )
    body["status"]["conditions"] = conds
