"""slurmrestd client (httpx, JWT): reads the Slurm view of nodes and jobs.

The API version is discovered, never assumed: :meth:`SlurmRest.connect`
reads ``/openapi`` and picks the newest ``/slurm/v0.0.NN/`` that this client
knows how to read (:data:`SUPPORTED_VERSIONS`) and that answers ``ping``.
Debian 12's Slurm 22.05.8 serves v0.0.36-v0.0.38, which have no node update
endpoint and no job requeue, so writes go through ``scontrol``
(:mod:`gpufleet.slurm.scontrol`).

Every failure -- connection refused, timeout, HTTP error, JSON with
``errors`` -- raises :class:`~gpufleet.slurm.errors.SlurmUnavailable`, which
the syncer treats as "Slurm view unknown" (fail closed).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from gpufleet.domain import slurm_sync
from gpufleet.slurm import hostlist
from gpufleet.slurm.errors import SlurmUnavailable

SUPPORTED_VERSIONS = ("v0.0.38", "v0.0.37", "v0.0.36")
"""Versions whose ``/nodes`` and ``/jobs`` schemas this module reads, newest first."""

RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING"})


@dataclass(frozen=True, slots=True)
class RestConfig:
    url: str
    user: str
    token: str
    timeout_s: float = 2.0
    """Per request; short, because a slow slurmrestd means an unknown view."""
    max_in_flight: int = 4
    """Requests in flight at once, over as many kept-alive connections. slurmrestd
    is one process: a burst of concurrent connections is refused (ConnectTimeout),
    which the syncer must read as "Slurm unknown"; a queue here is not. The wait
    for a slot does not count against ``timeout_s``."""


def node_view(raw: Mapping[str, Any]) -> slurm_sync.SlurmView:
    """The domain view of one REST node (``state`` + ``state_flags`` + ``reason``)."""
    state = str(raw.get("state") or "unknown").lower()
    flags = frozenset(str(f).upper() for f in raw.get("state_flags") or ())
    reason = raw.get("reason") or None
    return slurm_sync.SlurmView(state=state, flags=flags, reason=reason)


def job_nodes(raw: Mapping[str, Any]) -> frozenset[str]:
    alloc = (raw.get("job_resources") or {}).get("allocated_nodes") or []
    names = {str(a["nodename"]) for a in alloc if isinstance(a, Mapping) and a.get("nodename")}
    return frozenset(names or hostlist.expand(raw.get("nodes") or ""))


def job_view(raw: Mapping[str, Any]) -> slurm_sync.JobView:
    return slurm_sync.JobView(
        job_id=int(raw["job_id"]),
        priority=int(raw.get("priority") or 0),
        requeueable=bool(raw.get("requeue")),
        nodes=job_nodes(raw),
    )


def is_running(raw: Mapping[str, Any]) -> bool:
    return str(raw.get("job_state", "")).upper() in RUNNING_STATES


class SlurmRest:
    """A connection to one slurmrestd."""

    def __init__(self, config: RestConfig, *, version: str | None = None) -> None:
        self.config = config
        self.version = version
        self._client = httpx.AsyncClient(
            base_url=config.url.rstrip("/"),
            headers={"X-SLURM-USER-NAME": config.user, "X-SLURM-USER-TOKEN": config.token},
            timeout=config.timeout_s,
            limits=httpx.Limits(
                max_connections=config.max_in_flight,
                max_keepalive_connections=config.max_in_flight,
            ),
        )
        self._slots = asyncio.Semaphore(config.max_in_flight)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _get(self, path: str) -> dict[str, Any]:
        try:
            async with self._slots:
                resp = await self._client.get(path)
        except httpx.HTTPError as e:
            raise SlurmUnavailable(f"slurmrestd {self.config.url}{path}: {e!r}") from e
        if resp.status_code != 200:
            raise SlurmUnavailable(
                f"slurmrestd {path}: HTTP {resp.status_code} {resp.text[:200]!r}"
            )
        try:
            data = resp.json()
        except ValueError as e:
            raise SlurmUnavailable(f"slurmrestd {path}: not JSON") from e
        if not isinstance(data, dict):
            raise SlurmUnavailable(f"slurmrestd {path}: unexpected {type(data).__name__}")
        errors = data.get("errors") or []
        if errors:
            raise SlurmUnavailable(f"slurmrestd {path}: {errors}")
        return data

    async def served_versions(self) -> list[str]:
        """The ``/slurm/vX`` versions the server describes in ``/openapi``."""
        data = await self._get("/openapi")
        found = {
            m.group(1)
            for p in data.get("paths", {})
            if (m := re.match(r"^/slurm/(v\d+\.\d+\.\d+)/", p)) is not None
        }
        return sorted(found, key=lambda v: tuple(int(x) for x in v[1:].split(".")), reverse=True)

    async def connect(self) -> str:
        """Pick the newest served version we can read and check that it answers ping."""
        served = await self.served_versions()
        usable = [v for v in served if v in SUPPORTED_VERSIONS]
        if not usable:
            raise SlurmUnavailable(
                f"slurmrestd serves {served}; this gpufleet reads {list(SUPPORTED_VERSIONS)}"
            )
        for version in usable:
            try:
                await self._get(f"/slurm/{version}/ping")
            except SlurmUnavailable:
                continue
            self.version = version
            return version
        raise SlurmUnavailable(f"no slurmrestd version of {usable} answers ping")

    def _path(self, tail: str) -> str:
        if self.version is None:
            raise SlurmUnavailable("slurmrestd version not negotiated; call connect() first")
        return f"/slurm/{self.version}/{tail}"

    async def ping(self) -> dict[str, Any]:
        return await self._get(self._path("ping"))

    async def raw_nodes(self) -> list[dict[str, Any]]:
        data = await self._get(self._path("nodes"))
        return list(data.get("nodes") or [])

    async def nodes(self) -> dict[str, slurm_sync.SlurmView]:
        """Every node's view. ``/nodes`` rather than ``/node/{name}``: see :meth:`node`."""
        return {str(n["name"]): node_view(n) for n in await self.raw_nodes()}

    async def node(self, name: str) -> slurm_sync.SlurmView | None:
        """One node, fresh (before a write). In 22.05 this endpoint may report the base
        state of a partly used node as ``allocated`` instead of ``mixed``; the flags and
        reason, which the decisions use, are right."""
        data = await self._get(self._path(f"node/{name}"))
        for raw in data.get("nodes") or []:
            if raw.get("name") == name:
                return node_view(raw)
        return None

    async def raw_jobs(self) -> list[dict[str, Any]]:
        data = await self._get(self._path("jobs"))
        return list(data.get("jobs") or [])

    async def running_jobs(self) -> list[slurm_sync.JobView]:
        """Jobs holding nodes (finished jobs stay in ``/jobs`` for MinJobAge: filtered here)."""
        return [job_view(j) for j in await self.raw_jobs() if is_running(j)]
