"""The provisioning service's port to the Kubernetes API, on kr8s (async).

Only the calls provisioning makes: find a Machine by MAC, claim its token in
``status`` (guarded by ``resourceVersion``), create and delete bootstrap-token
Secrets, write audit Events. HTTP errors become :class:`ApiError` subclasses
naming the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
import kr8s
import kr8s.asyncio

from gpufleet.domain import well_known
from gpufleet.provision import machines

Json = dict[str, Any]
GV = f"{well_known.GROUP}/{well_known.VERSION}"
MERGE = {"Content-Type": "application/merge-patch+json"}


class ApiError(Exception):
    def __init__(self, what: str, status: int | None, message: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {message}" if status else f"{what}: {message}")
        self.status = status


class Conflict(ApiError):
    """409: the object changed since it was read, or already exists."""


class NotFound(ApiError):
    """404."""


class Gone(ApiError):
    """410: the resourceVersion a watch started from is too old; list again."""


MAX_IN_FLIGHT = 16
"""Apiserver requests in flight at once. A boot storm queues here instead of
opening a TLS connection per request (each handshake costs more CPU than the
request it carries); the kept-alive connections are reused."""
MAX_BACKGROUND = 2
"""Of those, how many may be background work (audit Events): a boot waits for
its claim and its token, never for the Events of the boots before it."""


class KubeApi:
    def __init__(self, api: Any, *, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self._api = api
        self._slots = asyncio.Semaphore(max_in_flight)
        self._background = asyncio.Semaphore(min(MAX_BACKGROUND, max_in_flight))

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> KubeApi:
        return cls(await kr8s.asyncio.api(kubeconfig=kubeconfig))

    async def call(
        self,
        what: str,
        method: str,
        *,
        url: str,
        version: str = "v1",
        namespace: str | None = None,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        background: bool = False,
    ) -> Json:
        if background:
            async with self._background:
                return await self.call(
                    what,
                    method,
                    url=url,
                    version=version,
                    namespace=namespace,
                    body=body,
                    headers=headers,
                    params=params,
                )
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": "application/json", **(headers or {})}
        if params:
            kwargs["params"] = dict(params)
        try:
            async with (
                self._slots,
                self._api.call_api(
                    method, version=version, namespace=namespace, url=url, **kwargs
                ) as resp,
            ):
                data: Json = resp.json() if resp.content else {}
                return data
        except (httpx.HTTPStatusError, kr8s.ServerError) as exc:
            response = exc.response
            if response is None:
                raise ApiError(what, None, str(exc)) from exc
            status = response.status_code
            message = response.text[:300]
            with contextlib.suppress(ValueError, AttributeError):
                message = str(response.json().get("message", ""))[:300]
            cls = {409: Conflict, 404: NotFound}.get(status, ApiError)
            raise cls(what, status, message) from None
        except httpx.HTTPError as exc:
            raise ApiError(what, None, f"{type(exc).__name__}: {exc}") from exc

    # -------------------------------------------------------------- machines

    async def machine_by_mac(self, mac: str) -> Json | None:
        data = await self.call(
            f"find machine with MAC {mac}",
            "GET",
            version=GV,
            url=machines.PLURAL,
            params={"labelSelector": machines.mac_label(mac)},
        )
        items = data.get("items") or []
        return items[0] if len(items) == 1 else None

    async def list_machines_at(self) -> tuple[list[Json], str]:
        """All Machines and the list's resourceVersion (where a watch starts)."""
        data = await self.call("list machines", "GET", version=GV, url=machines.PLURAL)
        rv = str((data.get("metadata") or {}).get("resourceVersion") or "")
        return list(data.get("items") or []), rv

    async def watch_machines(
        self, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[tuple[str, Json]]:
        """Machine watch events after ``resource_version`` (with bookmarks) until the
        server ends the watch. A too-old version raises :class:`Gone`."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        try:
            async with self._api.call_api(
                "GET",
                version=GV,
                url=machines.PLURAL,
                params=params,
                stream=True,
                timeout=httpx.Timeout(timeout_s + 30, connect=5),
            ) as resp:
                async for line in resp.aiter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    kind, obj = str(event.get("type")), event.get("object") or {}
                    if kind == "ERROR":
                        code = obj.get("code")
                        cls = Gone if code == 410 else ApiError
                        raise cls("watch machines", code, str(obj.get("message", ""))[:300])
                    yield kind, obj
        except (httpx.HTTPStatusError, kr8s.ServerError) as exc:
            status = exc.response.status_code if exc.response is not None else None
            cls = Gone if status == 410 else ApiError
            raise cls("watch machines", status, str(exc)[:300]) from None
        except httpx.HTTPError as exc:
            raise ApiError("watch machines", None, f"{type(exc).__name__}: {exc}") from exc

    async def get_machine(self, name: str) -> Json:
        return await self.call(
            f"get machine {name}", "GET", version=GV, url=f"{machines.PLURAL}/{name}"
        )

    async def list_machines(self) -> list[Json]:
        data = await self.call("list machines", "GET", version=GV, url=machines.PLURAL)
        return list(data.get("items") or [])

    async def create_machine(self, body: Mapping[str, Any]) -> Json:
        return await self.call("create machine", "POST", version=GV, url=machines.PLURAL, body=body)

    async def patch_machine(self, name: str, patch: Mapping[str, Any]) -> Json:
        return await self.call(
            f"patch machine {name}",
            "PATCH",
            version=GV,
            url=f"{machines.PLURAL}/{name}",
            body=patch,
            headers=MERGE,
        )

    async def patch_machine_status(
        self, name: str, status: Mapping[str, Any], resource_version: str | None = None
    ) -> Json:
        body: Json = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self.call(
            f"patch machine {name} status",
            "PATCH",
            version=GV,
            url=f"{machines.PLURAL}/{name}/status",
            body=body,
            headers=MERGE,
        )

    # --------------------------------------------------------------- secrets

    async def get_secret(self, namespace: str, name: str) -> Json:
        return await self.call(
            f"get secret {namespace}/{name}", "GET", namespace=namespace, url=f"secrets/{name}"
        )

    async def create_secret(self, namespace: str, body: Mapping[str, Any]) -> Json:
        return await self.call(
            f"create secret in {namespace}", "POST", namespace=namespace, url="secrets", body=body
        )

    async def delete_secret(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFound):
            await self.call(
                f"delete secret {namespace}/{name}",
                "DELETE",
                namespace=namespace,
                url=f"secrets/{name}",
            )

    # ---------------------------------------------------------------- events

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        """Audit Events are background work (:data:`MAX_BACKGROUND`)."""
        await self.call(
            "create event", "POST", namespace=namespace, url="events", body=event, background=True
        )
