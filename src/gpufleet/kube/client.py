"""The controller's port to the Kubernetes API, on kr8s (async).

Only the calls the controller makes, with gpufleet's own errors: a 409 is a
:class:`Conflict` (re-read and decide again), a 404 :class:`NotFound`,
anything else :class:`ApiError` naming the request.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx
import kr8s
import kr8s.asyncio

from gpufleet.domain import well_known

Json = dict[str, Any]
MERGE = {"Content-Type": "application/merge-patch+json"}
GV = f"{well_known.GROUP}/{well_known.VERSION}"


class ApiError(Exception):
    """A Kubernetes API request failed."""

    def __init__(self, what: str, status: int | None, message: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {message}" if status else f"{what}: {message}")
        self.status = status


class Conflict(ApiError):
    """The object changed since it was read (HTTP 409)."""


class NotFound(ApiError):
    """No such object (HTTP 404)."""


class TooManyRequests(ApiError):
    """HTTP 429: for an eviction, a PodDisruptionBudget said no (retry later)."""


class KubeClient:
    """Async access to the objects the lifecycle controller reads and writes."""

    def __init__(self, api: Any) -> None:
        self._api = api

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> KubeClient:
        return cls(await kr8s.asyncio.api(kubeconfig=kubeconfig))

    async def _call(
        self,
        what: str,
        method: str,
        *,
        version: str = "v1",
        namespace: str | None = None,
        url: str,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Json:
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": "application/json", **(headers or {})}
        if params:
            kwargs["params"] = dict(params)
        try:
            async with self._api.call_api(
                method, version=version, namespace=namespace, url=url, **kwargs
            ) as resp:
                data: Json = resp.json() if resp.content else {}
                return data
        except (httpx.HTTPStatusError, kr8s.ServerError) as exc:
            # kr8s wraps 4xx/5xx answers in its ServerError (with the response).
            response = exc.response
            if response is None:
                raise ApiError(what, None, str(exc)) from exc
            status = response.status_code
            with contextlib.suppress(ValueError):
                message = str(response.json().get("message", ""))[:500]
                raise _error(status)(what, status, message) from None
            raise _error(status)(what, status, response.text[:500]) from None
        except httpx.HTTPError as exc:
            raise ApiError(what, None, f"{type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------------ nodes

    async def get_node(self, name: str) -> Json:
        return await self._call(f"get node {name}", "GET", url=f"nodes/{name}")

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> Json:
        return await self._call(
            f"patch node {name}", "PATCH", url=f"nodes/{name}", body=patch, headers=MERGE
        )

    async def pods_on(self, node: str) -> list[Json]:
        data = await self._call(
            f"list pods on {node}",
            "GET",
            url="pods",
            params={"fieldSelector": f"spec.nodeName={node}"},
        )
        return list(data.get("items") or [])

    async def evict(self, namespace: str, name: str) -> None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        await self._call(
            f"evict pod {namespace}/{name}",
            "POST",
            namespace=namespace,
            url=f"pods/{name}/eviction",
            body=body,
        )

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self._call(
            f"delete pod {namespace}/{name}", "DELETE", namespace=namespace, url=f"pods/{name}"
        )

    async def get_secret(self, namespace: str, name: str) -> Json:
        return await self._call(
            f"get secret {namespace}/{name}", "GET", namespace=namespace, url=f"secrets/{name}"
        )

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        await self._call("create event", "POST", namespace=namespace, url="events", body=event)

    # --------------------------------------------------------- custom objects

    async def get_custom(self, plural: str, name: str) -> Json:
        return await self._call(f"get {plural}/{name}", "GET", version=GV, url=f"{plural}/{name}")

    async def create_custom(self, plural: str, body: Mapping[str, Any]) -> Json:
        return await self._call(f"create {plural}", "POST", version=GV, url=plural, body=body)

    async def patch_custom(self, plural: str, name: str, patch: Mapping[str, Any]) -> Json:
        """A JSON merge patch of a custom object (its metadata or spec, not its status)."""
        return await self._call(
            f"patch {plural}/{name}",
            "PATCH",
            version=GV,
            url=f"{plural}/{name}",
            body=patch,
            headers=MERGE,
        )

    async def patch_status(self, plural: str, name: str, status: Mapping[str, Any]) -> Json:
        return await self._call(
            f"patch {plural}/{name} status",
            "PATCH",
            version=GV,
            url=f"{plural}/{name}/status",
            body={"status": status},
            headers=MERGE,
        )


def _error(status: int) -> type[ApiError]:
    return {409: Conflict, 404: NotFound, 429: TooManyRequests}.get(status, ApiError)
