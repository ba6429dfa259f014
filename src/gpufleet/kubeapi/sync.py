"""A small synchronous facade for the tools that run outside an event loop.

The local cluster's start-up (readiness polls, creating KWOK Nodes) and the
demo's set-up (CRDs, Secrets, the FleetPolicy) are plain scripts: they call
the apiserver by path with the cluster's bearer token and CA, and get the
same typed errors as the async port. Plain httpx, because kr8s's synchronous
API runs its own event loop in a thread and needs a kubeconfig, which the
local cluster does not have until its apiserver has written its certificate.
"""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path
from typing import Any

import httpx

from gpufleet.kubeapi.errors import Unreachable, error_for
from gpufleet.kubeapi.resources import Json, Patch


class SyncKube:
    """Bearer-token HTTP to one apiserver, with the cluster's own CA."""

    def __init__(self, url: str, token: str, ca_file: Path, *, timeout: float = 10) -> None:
        self._url, self._token, self._ca_file, self._timeout = url, token, ca_file, timeout
        self._client: httpx.Client | None = None

    def _http(self) -> httpx.Client:
        # Built on first use: the CA file appears once the apiserver has generated it.
        if self._client is None:
            self._client = httpx.Client(
                base_url=self._url,
                verify=ssl.create_default_context(cafile=str(self._ca_file)),
                headers={"Authorization": f"Bearer {self._token}"},
                timeout=self._timeout,
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _send(self, what: str, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return self._http().request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise Unreachable(what, None, f"{type(exc).__name__}: {exc}") from exc

    def _json(self, what: str, method: str, path: str, ok: tuple[int, ...], **kw: Any) -> Json:
        resp = self._send(what, method, path, **kw)
        if resp.status_code not in ok:
            message = resp.text[:300]
            with contextlib.suppress(ValueError, AttributeError):
                message = str(resp.json().get("message", ""))[:300]
            raise error_for(resp.status_code)(what, resp.status_code, message)
        data: Json = resp.json() if resp.content else {}
        return data

    def status(self, path: str) -> int:
        """The HTTP status of a GET (readiness probes: any answer is a result)."""
        return self._send(f"GET {path}", "GET", path).status_code

    def get(self, path: str, *, params: dict[str, str] | None = None) -> Json:
        return self._json(f"GET {path}", "GET", path, (200,), params=params)

    def exists(self, path: str) -> bool:
        return self.status(path) == 200

    def create(self, path: str, body: Json, *, exist_ok: bool = True) -> Json:
        """POST ``body``; an object that exists already is fine when ``exist_ok``."""
        ok = (200, 201, 202, 409) if exist_ok else (200, 201, 202)
        return self._json(f"POST {path}", "POST", path, ok, json=body)

    def patch(self, path: str, body: Json, kind: Patch = Patch.MERGE) -> Json:
        return self._json(
            f"PATCH {path}",
            "PATCH",
            path,
            (200,),
            json=body,
            headers={"Content-Type": kind.value},
        )

    def delete(self, path: str) -> None:
        """Delete; whatever is not there is already deleted."""
        self._json(f"DELETE {path}", "DELETE", path, (200, 202, 404))
