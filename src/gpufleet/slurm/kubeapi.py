"""The syncer's Kubernetes adapter (kr8s, async): Nodes, Pods, ConfigMaps, bindings.

Everything is raw JSON dicts (the pure modules read them); patches are
strategic-merge patches so that Node conditions merge by ``type``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import kr8s
import kr8s.asyncio

STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json"}
MERGE = {"Content-Type": "application/merge-patch+json"}


class KubeApi:
    def __init__(self, api: kr8s.asyncio.Api) -> None:
        self.api = api

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> KubeApi:
        return cls(await kr8s.asyncio.api(kubeconfig=kubeconfig))

    async def _json(
        self, method: str, url: str, *, version: str = "v1", base: str = "", **kw: Any
    ) -> dict[str, Any]:
        async with self.api.call_api(method, version=version, base=base, url=url, **kw) as resp:
            data: dict[str, Any] = resp.json()
            return data

    async def _maybe(self, method: str, url: str, **kw: Any) -> dict[str, Any] | None:
        try:
            return await self._json(method, url, **kw)
        except kr8s.ServerError as e:
            if e.response is not None and e.response.status_code == 404:
                return None
            raise

    # -- nodes --------------------------------------------------------------------

    async def list_nodes(self, label_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        params = {"labelSelector": label_selector} if label_selector else {}
        data = await self._json("GET", "nodes", params=params)
        return list(data.get("items") or []), str(data["metadata"].get("resourceVersion", ""))

    async def get_node(self, name: str) -> dict[str, Any] | None:
        return await self._maybe("GET", f"nodes/{name}")

    async def patch_node(self, name: str, patch: dict[str, Any], *, status: bool = False) -> None:
        url = f"nodes/{name}/status" if status else f"nodes/{name}"
        await self._json("PATCH", url, content=json.dumps(patch), headers=STRATEGIC)

    async def watch(
        self, url: str, resource_version: str, *, version: str = "v1", timeout_s: int = 300
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Raw watch events after ``resource_version``; ends when the server closes it."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "false",
            "timeoutSeconds": str(timeout_s),
        }
        async with self.api.call_api(
            "GET",
            version=version,
            url=url,
            params=params,
            stream=True,
            timeout=httpx.Timeout(timeout_s + 30, connect=5),
        ) as resp:
            async for line in resp.aiter_lines():
                if not line:
                    continue
                event = json.loads(line)
                yield str(event["type"]), event["object"]

    # -- pods ---------------------------------------------------------------------

    async def list_pods(self, field_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        params = {"fieldSelector": field_selector} if field_selector else {}
        data = await self._json("GET", "pods", params=params)
        return list(data.get("items") or []), str(data["metadata"].get("resourceVersion", ""))

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._maybe("GET", f"namespaces/{namespace}/pods/{name}")

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind like a scheduler does (``pods/binding``); the uid guards against a new pod
        with the same name."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._json(
            "POST", f"namespaces/{namespace}/pods/{name}/binding", content=json.dumps(body)
        )

    async def post_event(self, namespace: str, body: dict[str, Any]) -> None:
        with contextlib.suppress(kr8s.ServerError):
            await self._json("POST", f"namespaces/{namespace}/events", content=json.dumps(body))

    # -- generic --------------------------------------------------------------------

    async def get(self, url: str, *, version: str = "v1", base: str = "") -> dict[str, Any] | None:
        try:
            return await self._json("GET", url, version=version, base=base)
        except kr8s.ServerError as e:
            if e.response is not None and e.response.status_code == 404:
                return None
            raise

    async def apply(
        self, url: str, body: dict[str, Any], *, version: str = "v1", base: str = ""
    ) -> dict[str, Any]:
        """Server-side apply with field manager ``gpufleet``."""
        return await self._json(
            "PATCH",
            url,
            version=version,
            base=base,
            content=json.dumps(body),
            params={"fieldManager": "gpufleet", "force": "true"},
            headers={"Content-Type": "application/apply-patch+yaml"},
        )

    async def merge_patch(
        self, url: str, patch: dict[str, Any], *, version: str = "v1", base: str = ""
    ) -> dict[str, Any]:
        return await self._json(
            "PATCH", url, version=version, base=base, content=json.dumps(patch), headers=MERGE
        )
