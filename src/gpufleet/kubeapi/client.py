"""The production :class:`~gpufleet.kubeapi.port.KubePort`, on kr8s (async).

One place builds URLs, sends JSON, and turns every kr8s/httpx failure into a
:mod:`gpufleet.kubeapi.errors` class naming the request. ``max_in_flight``
bounds requests at once (the provisioning service's boot storms queue here
instead of opening a connection per request); Events then get at most
``MAX_BACKGROUND`` of those slots, so a caller never waits behind audit Events, and a
request made under :func:`gpufleet.kubeapi.slots.urgent` takes the next slot before any
other (decision 0292).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import kr8s
import kr8s.asyncio
import yaml

from gpufleet.kubeapi import contexts, pool
from gpufleet.kubeapi.errors import ApiError, Gone, KubeconfigError, Unreachable, error_for
from gpufleet.kubeapi.port import ObjectList, WatchEvent
from gpufleet.kubeapi.resources import EVENTS, PODS, Json, Patch, Resource
from gpufleet.kubeapi.slots import Slots

MAX_BACKGROUND = 2
"""Of ``max_in_flight``, how many requests may be background work (Events)."""
SERVICE_IN_FLIGHT = 8
"""``max_in_flight`` of the long-running services that react to bursts (the lifecycle
controller, the Slurm syncer). Unbounded, a burst of 32 faults opened a TLS connection per
request beyond the 20 the pool keeps alive (a handshake costs more CPU than the request it
carries), and httpcore looks at every pooled connection for each request: with 8, a burst
of 32 at 2,000 nodes was cordoned with p99 0.54-0.66 s instead of 1.26 s
(docs/controller.md)."""
URGENT_RESERVE = 4
"""Slots beyond ``max_in_flight`` that only urgent requests (:func:`gpufleet.kubeapi.slots.urgent`:
the lifecycle controller's cordoning record writes, the Lease's reads and writes) may use:
one never waits for ordinary work to end (decision 0292)."""
LIST_PAGE = 500
"""Objects per page of a list (the page size kubectl and client-go's informers use)."""
LIST_RESTARTS = 3
"""How many times a list whose continue token expired starts again before it fails."""


@dataclass(frozen=True)
class Credentials:
    """An apiserver's address, its CA and the user's certificate or token (files)."""

    server: str
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    token: str | None
    insecure: bool


def _path_or_none(path: Any) -> str | None:
    return str(path) if path else None


class KubeApi:
    """Async access to the apiserver through a kr8s API object."""

    def __init__(self, api: Any, *, max_in_flight: int | None = None) -> None:
        self._api = api
        self.requests: Counter[tuple[str, str]] = Counter()
        """Requests sent, by HTTP method and resource (``nodes``, ``pods/eviction``):
        what a component costs the apiserver (the controller exports it as a metric)."""
        self._slots = Slots(max_in_flight, URGENT_RESERVE) if max_in_flight else None
        self._background = (
            asyncio.Semaphore(min(MAX_BACKGROUND, max_in_flight)) if max_in_flight else None
        )
        self._kept: object = None
        """The kr8s session whose pool keeps its sockets (:mod:`gpufleet.kubeapi.pool`)."""

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | None = None,
        *,
        context: str | None = None,
        max_in_flight: int | None = None,
    ) -> KubeApi:
        """Read the credentials and ask the apiserver its version (kr8s does both).

        ``context``: a context of the kubeconfig; default: the one this process was
        told to use (``--context``, :mod:`gpufleet.kubeapi.contexts`), else the
        kubeconfig's current-context.

        Raises :class:`KubeconfigError` when there are no usable credentials (a named
        file that is missing: kr8s would quietly fall back to in-cluster credentials
        and then fail without naming it; a context the kubeconfig does not have),
        :class:`Unreachable` when no answer came, and the error class of the status
        when the apiserver refused.
        """
        for path in (kubeconfig or "").split(os.pathsep):
            if path and not os.path.isfile(os.path.expanduser(path)):
                raise KubeconfigError(f"read kubeconfig {path}", None, "no such file")
        context = context or contexts.chosen()
        what = f"connect with kubeconfig {kubeconfig}" if kubeconfig else "connect"
        if context:
            what += f", context {context}"
        try:
            api = await kr8s.asyncio.api(kubeconfig=kubeconfig, context=context)
        except (httpx.HTTPStatusError, kr8s.ServerError) as exc:
            raise _translate(what, exc) from None
        except (httpx.HTTPError, kr8s.APITimeoutError) as exc:
            server = _server_of(exc)
            where = f"{what} to {server}" if server else what
            raise Unreachable(where, None, f"{type(exc).__name__}: {exc}") from exc
        except (ValueError, KeyError, TypeError, AttributeError, OSError, yaml.YAMLError) as exc:
            # kr8s reads the file, then the context's cluster and user: a YAML error,
            # a missing key or a value of the wrong type all mean a malformed kubeconfig.
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise KubeconfigError(what, None, f"{type(exc).__name__}: {first}"[:300]) from exc
        return cls(api, max_in_flight=max_in_flight)

    def credentials(self) -> Credentials:
        """Where and as whom this client talks, as kr8s resolved them from the kubeconfig
        and context (embedded certificates written to files, an exec plugin run): for a
        second client that must reach the same apiserver as the same user (kopf's login)."""
        auth = self._api.auth
        return Credentials(
            server=str(auth.server),
            ca_file=_path_or_none(auth.server_ca_file),
            cert_file=_path_or_none(auth.client_cert_file),
            key_file=_path_or_none(auth.client_key_file),
            token=auth.token or None,
            insecure=bool(getattr(auth, "_insecure_skip_tls_verify", False)),
        )

    # ------------------------------------------------------------------ core

    async def _request(
        self,
        what: str,
        method: str,
        resource: Resource,
        *,
        name: str = "",
        sub: str = "",
        namespace: str | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Json:
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"] = {"Content-Type": content_type}
        if params:
            kwargs["params"] = dict(params)
        url = "/".join(p for p in (resource.plural, name, sub) if p)
        self.requests[(method, f"{resource.plural}/{sub}" if sub else resource.plural)] += 1
        self._keep_sockets()
        async with self._slot():
            try:
                async with self._api.call_api(
                    method, version=resource.version, namespace=namespace, url=url, **kwargs
                ) as resp:
                    data: Json = resp.json() if resp.content else {}
                    return data
            except (httpx.HTTPStatusError, kr8s.ServerError) as exc:
                raise _translate(what, exc) from None
            except (httpx.HTTPError, kr8s.APITimeoutError, OSError) as exc:
                raise Unreachable(what, None, f"{type(exc).__name__}: {exc}") from exc

    def _keep_sockets(self) -> None:
        """The idle-connection check of kr8s's session answered from each connection's
        socket (decision 0253), once per session kr8s makes."""
        session = getattr(self._api, "_session", None)
        if session is not None and session is not self._kept:
            self._kept = session
            pool.keep_sockets(session)

    def _slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._slots.hold() if self._slots is not None else contextlib.nullcontext()

    # ------------------------------------------------------------------ verbs

    async def get(self, resource: Resource, name: str, *, namespace: str | None = None) -> Json:
        return await self._request(
            f"get {resource} {_ref(namespace, name)}",
            "GET",
            resource,
            name=name,
            namespace=namespace,
        )

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        """Every object, read in pages of :data:`LIST_PAGE` (``limit`` and ``continue``):
        one snapshot, as one request would read it, without the apiserver building (and
        the client holding) a 12,500-Node answer at once. A continue token that expired
        mid-way (410) starts the list again, a bounded number of times."""
        params = _selectors(label_selector, field_selector)
        what = f"list {resource}"
        for attempt in range(LIST_RESTARTS + 1):
            items: list[Json] = []
            rv, token = "", ""
            try:
                while True:
                    page = {**params, "limit": str(LIST_PAGE)}
                    if token:
                        page["continue"] = token
                    data = await self._request(
                        what, "GET", resource, namespace=namespace, params=page
                    )
                    items.extend(data.get("items") or [])
                    meta = data.get("metadata") or {}
                    rv = rv or str(meta.get("resourceVersion") or "")
                    token = str(meta.get("continue") or "")
                    if not token:
                        return ObjectList(items, rv)
            except Gone:
                if attempt == LIST_RESTARTS:
                    raise
        raise AssertionError("unreachable")  # the loop returns or raises

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
        what = f"watch {resource}"
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true" if bookmarks else "false",
            "timeoutSeconds": str(timeout_s),
            **_selectors(label_selector, field_selector),
        }
        self.requests[("WATCH", resource.plural)] += 1
        try:
            async with self._api.call_api(
                "GET",
                version=resource.version,
                namespace=namespace,
                url=resource.plural,
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
                        raise error_for(code)(what, code, str(obj.get("message", ""))[:300])
                    if kind == "BOOKMARK" and not bookmarks:
                        continue
                    yield WatchEvent(kind, obj)
        except (httpx.HTTPStatusError, kr8s.ServerError) as exc:
            raise _translate(what, exc) from None
        except (httpx.HTTPError, kr8s.APITimeoutError, OSError) as exc:
            raise Unreachable(what, None, f"{type(exc).__name__}: {exc}") from exc

    async def create(
        self, resource: Resource, body: Mapping[str, Any], *, namespace: str | None = None
    ) -> Json:
        name = str((body.get("metadata") or {}).get("name") or "")
        return await self._request(
            f"create {resource} {_ref(namespace, name)}",
            "POST",
            resource,
            namespace=namespace,
            body=body,
        )

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
        return await self._request(
            f"patch {resource} {_ref(namespace, name)}{' status' if status else ''}",
            "PATCH",
            resource,
            name=name,
            sub="status" if status else "",
            namespace=namespace,
            body=patch,
            content_type=kind.value,
        )

    async def apply(
        self,
        resource: Resource,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        field_manager: str = "gpufleet",
    ) -> Json:
        return await self._request(
            f"apply {resource} {_ref(namespace, name)}",
            "PATCH",
            resource,
            name=name,
            namespace=namespace,
            body=body,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": field_manager, "force": "true"},
        )

    async def delete(self, resource: Resource, name: str, *, namespace: str | None = None) -> None:
        await self._request(
            f"delete {resource} {_ref(namespace, name)}",
            "DELETE",
            resource,
            name=name,
            namespace=namespace,
        )

    async def delete_all(self, resource: Resource, *, namespace: str, label_selector: str) -> None:
        await self._request(
            f"delete {resource} in {namespace} ({label_selector})",
            "DELETE",
            resource,
            namespace=namespace,
            params={"labelSelector": label_selector},
        )

    async def evict(self, namespace: str, name: str) -> None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        await self._request(
            f"evict pod {namespace}/{name}",
            "POST",
            PODS,
            name=name,
            sub="eviction",
            namespace=namespace,
            body=body,
        )

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self._request(
            f"bind pod {namespace}/{name} to {node}",
            "POST",
            PODS,
            name=name,
            sub="binding",
            namespace=namespace,
            body=body,
        )

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        if self._background is None:
            await self.create(EVENTS, event, namespace=namespace)
            return
        async with self._background:
            await self.create(EVENTS, event, namespace=namespace)


def _ref(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


def _selectors(label_selector: str, field_selector: str) -> dict[str, str]:
    params = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def _server_of(exc: Exception) -> str:
    """The apiserver a failed request went to (scheme, host, port), if httpx kept it."""
    try:
        url = exc.request.url  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # httpx raises RuntimeError when it has no request
        return ""
    return f"{url.scheme}://{url.host}:{url.port}" if url.port else f"{url.scheme}://{url.host}"


def _translate(what: str, exc: httpx.HTTPStatusError | kr8s.ServerError) -> ApiError:
    """kr8s wraps 4xx/5xx answers in its ServerError (with the response)."""
    response = exc.response
    if response is None:
        return ApiError(what, None, str(exc)[:500])
    status = response.status_code
    message = response.text[:500]
    with contextlib.suppress(ValueError, AttributeError):
        message = str(response.json().get("message", ""))[:500]
    return error_for(status)(what, status, message)
