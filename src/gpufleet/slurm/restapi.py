"""slurmrestd client (httpx, JWT): reads the Slurm view of nodes and jobs, and
writes node drains where the API has them.

The API version is discovered, never assumed: :meth:`SlurmRest.connect`
reads ``/openapi`` and picks the newest ``/slurm/v0.0.NN/`` that this client
knows how to read (:data:`SUPPORTED_VERSIONS`) and that answers ``ping``.
Slurm 24.11 serves v0.0.40-v0.0.42; Debian 12's Slurm 22.05.8 serves
v0.0.36-v0.0.38. The schemas differ, and every difference is decoded here and
only here (:func:`node_view`, :func:`job_view`, :func:`number`):

* node ``state``: one lowercase base state plus ``state_flags`` up to v0.0.38;
  one upper-case list (``["MIXED", "DRAIN"]``) from v0.0.40;
* job ``job_state``: a string, then a list (``["RUNNING"]``);
* numbers such as ``priority``: plain, then ``{"set", "infinite", "number"}``;
* a job's nodes: ``job_resources.allocated_nodes[].nodename`` (v0.0.38, v0.0.40),
  ``job_resources.nodes.allocation[].name`` (v0.0.41+), and always ``nodes``;
* collection paths end in ``/`` from v0.0.40 (``nodes/``, ``jobs/``).

From v0.0.40 the API updates nodes (``POST node/{name}``, ``POST nodes/`` for
several) and reconfigures (``GET reconfigure/``): :class:`gpufleet.slurm.writes.SlurmWrites`
uses them then; v0.0.38 has neither, so writes go through ``scontrol``
(:mod:`gpufleet.slurm.scontrol`), and a job requeue always does (no API has one).

Every failure to get an answer -- connection refused, timeout, HTTP error,
JSON with ``errors`` on a read -- raises
:class:`~gpufleet.slurm.errors.SlurmUnavailable`, which the syncer treats as
"Slurm view unknown" (fail closed). A write Slurm answers with errors raises
:class:`~gpufleet.slurm.errors.SlurmCommandFailed`, like a refused scontrol.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import httpx

from gpufleet.domain import departure, hostlist, slurm_sync
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmUnavailable

SUPPORTED_VERSIONS = ("v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38", "v0.0.37", "v0.0.36")
"""Versions whose ``/nodes`` and ``/jobs`` schemas this module reads, newest first
(Slurm 24.11 serves the first three, 22.05 the last three)."""

NODE_UPDATES_SINCE = (0, 0, 40)
"""The first API version with node update (drain, undrain) and reconfigure."""

RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING"})

BASE_STATES = frozenset({"IDLE", "DOWN", "ALLOCATED", "MIXED", "ERROR", "FUTURE", "UNKNOWN"})
"""A v0.0.40+ node state list holds one of these; every other entry is a flag."""

T = TypeVar("T")


def version_key(version: str) -> tuple[int, ...]:
    """``v0.0.41`` -> ``(0, 0, 41)``, for ordering and feature checks."""
    return tuple(int(x) for x in version.removeprefix("v").split("."))


def number(value: Any) -> int | None:
    """A plain number, or v0.0.40+'s ``{"set", "infinite", "number"}``; None when unset
    or infinite."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


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
    first_collection_timeout_s: float = 30.0
    """A whole collection's (``/nodes``, ``/jobs``) first read, before any was timed:
    at 12,500 nodes slurmrestd takes longer than ``timeout_s`` to answer ``/nodes``.
    ``connect`` has already had a ping answered within ``timeout_s``, so a frozen
    server does not get this long."""
    collection_timeout_factor: float = 4.0
    """Later collection reads may take this many times the last one that succeeded
    (never less than ``timeout_s``), so a server that stops answering is still
    noticed within a few of its own read times."""
    max_collection_timeout_s: float = 60.0
    reconfigure_timeout_s: float = 30.0
    """A reconfigure's answer: slurmctld answers it before it restarts (24.11), but a
    loaded one may take longer than ``timeout_s``, and a reconfigure that times out may
    have been delivered (the operator then waits before another)."""


class CollectionTimeout:
    """How long one collection read may take, learned from the last reads that succeeded.

    A fixed timeout is wrong at one end of the fleet range or the other: 2 s fails every
    ``/nodes`` read at 12,500 nodes (the view is then unknown and nothing is drained), and
    30 s leaves a frozen slurmrestd unnoticed for 30 s at 4 nodes. So: the first read is
    allowed ``first_collection_timeout_s``; after a success, ``factor`` times what it took
    (at least ``timeout_s``); after a timeout of a server that still answers a ping, twice
    the last allowance, up to the maximum, so a fleet that grew between two reads is read
    again rather than never."""

    def __init__(self, config: RestConfig) -> None:
        self._config = config
        self._allowed = max(config.timeout_s, config.first_collection_timeout_s)

    @property
    def seconds(self) -> float:
        return self._allowed

    def succeeded(self, took_s: float) -> None:
        c = self._config
        learned = c.collection_timeout_factor * took_s
        self._allowed = min(c.max_collection_timeout_s, max(c.timeout_s, learned))

    def timed_out(self) -> None:
        self._allowed = min(self._config.max_collection_timeout_s, 2 * self._allowed)


def node_view(raw: Mapping[str, Any]) -> slurm_sync.SlurmView:
    """The domain view of one REST node, of any supported version.

    v0.0.36-38: ``state`` ("idle") + ``state_flags`` (["DRAIN"]); v0.0.40+:
    ``state`` (["IDLE", "DRAIN"]): its base state and the rest as flags.
    """
    state = raw.get("state")
    if isinstance(state, list):
        names = [str(s).upper() for s in state]
        base = next((s for s in names if s in BASE_STATES), "UNKNOWN")
        flags = frozenset(s for s in names if s != base)
    else:
        base = str(state or "unknown")
        flags = frozenset(str(f).upper() for f in raw.get("state_flags") or ())
    reason = raw.get("reason") or None
    addresses = frozenset(
        str(raw[k]).strip() for k in ("address", "hostname") if str(raw.get(k) or "").strip()
    )
    started = number(raw.get("slurmd_start_time"))
    return slurm_sync.SlurmView(
        state=base.lower(),
        flags=flags,
        reason=reason,
        addresses=addresses,
        slurmd_started=float(started) if started else None,
    )


def job_nodes(raw: Mapping[str, Any]) -> frozenset[str]:
    """The job's nodes: from its allocation (either layout), else its ``nodes`` hostlist."""
    resources = raw.get("job_resources") or {}
    alloc = resources.get("allocated_nodes") or []  # v0.0.38, v0.0.40
    names = {str(a["nodename"]) for a in alloc if isinstance(a, Mapping) and a.get("nodename")}
    nodes = resources.get("nodes")
    if isinstance(nodes, Mapping):  # v0.0.41+
        names |= {
            str(a["name"])
            for a in nodes.get("allocation") or []
            if isinstance(a, Mapping) and a.get("name")
        }
    return frozenset(names or hostlist.expand(raw.get("nodes") or ""))


def job_state(raw: Mapping[str, Any]) -> str:
    """The job's base state, upper case (``RUNNING``); v0.0.40+ gives a list."""
    state = raw.get("job_state")
    if isinstance(state, list):
        state = state[0] if state else ""
    return str(state or "").upper()


def job_view(raw: Mapping[str, Any]) -> slurm_sync.JobView:
    return slurm_sync.JobView(
        job_id=int(raw["job_id"]),
        priority=number(raw.get("priority")) or 0,
        requeueable=bool(raw.get("requeue")),
        nodes=job_nodes(raw),
        wants_notice=departure.wants_notice(str(raw.get("comment") or "")),
    )


def is_running(raw: Mapping[str, Any]) -> bool:
    return job_state(raw) in RUNNING_STATES


def job_exit_code(raw: Mapping[str, Any]) -> int | None:
    """The exit code a finished job's batch script returned; None if a signal ended it
    or none is given. v0.0.38 (Slurm 22.05) gives the wait status as an integer (exit
    code << 8, or the signal in the low bits); v0.0.39+ an object with ``status``
    (``SIGNALED`` for a signal) and ``return_code`` (a number, or v0.0.40+'s
    ``{"set", "number"}``)."""
    code = raw.get("exit_code")
    if isinstance(code, Mapping):
        status = code.get("status")
        statuses = status if isinstance(status, list) else [status]
        if "SIGNALED" in statuses:
            return None
        return number(code.get("return_code"))
    status = number(code)
    if status is None or status & 0x7F:
        return None
    return (status >> 8) & 0xFF


def ended_job(raw: Mapping[str, Any]) -> tuple[int, departure.Ended]:
    """A job that holds no node any more: its id and Slurm's record of how it ended."""
    return int(raw["job_id"]), departure.Ended(job_state(raw), job_exit_code(raw))


JobEntry: TypeAlias = slurm_sync.JobView | tuple[int, departure.Ended]
"""One job of a ``/jobs`` answer that the syncer keeps: running, or ended after asking
for a departure notice."""


def split_jobs(
    entries: Sequence[JobEntry],
) -> tuple[list[slurm_sync.JobView], dict[int, departure.Ended]]:
    """The running jobs, and the ended ones by id."""
    running = [e for e in entries if isinstance(e, slurm_sync.JobView)]
    ended = dict(e for e in entries if isinstance(e, tuple))
    return running, ended


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
        self._collection_timeouts: dict[str, CollectionTimeout] = {}
        self.ended_jobs: Mapping[int, departure.Ended] = {}
        """The jobs that asked for a departure notice and hold no node any more, as the
        last ``/jobs`` read saw them."""

    async def aclose(self) -> None:
        await self._client.aclose()

    @property
    def updates_nodes(self) -> bool:
        """Whether the negotiated version has node update and reconfigure (v0.0.40+)."""
        return self.version is not None and version_key(self.version) >= NODE_UPDATES_SINCE

    def collection_timeout(self, name: str) -> CollectionTimeout:
        """The learned allowance for reading collection ``name`` (``nodes``, ``jobs``)."""
        if name not in self._collection_timeouts:
            self._collection_timeouts[name] = CollectionTimeout(self.config)
        return self._collection_timeouts[name]

    async def _get(self, path: str) -> dict[str, Any]:
        """One small read (ping, one node, ``/openapi``), decoded on the event loop."""
        resp = await self._response(path)
        try:
            data = resp.json()
        except ValueError as e:
            raise SlurmUnavailable(f"slurmrestd {path}: not JSON") from e
        return _checked(path, data)

    async def _response(
        self,
        path: str,
        *,
        learned: CollectionTimeout | None = None,
        since: float | None = None,
    ) -> httpx.Response:
        """One read's answer, status 200; with ``learned``, under that allowance and
        teaching it this read's time.

        With ``since`` (epoch seconds) Slurm is asked for the data only if it changed after
        that (``update_time``); an answer of 304 Not Modified raises :class:`Unchanged`."""
        params = {"update_time": str(int(since))} if since is not None else None
        try:
            async with self._slots:
                started = time.monotonic()
                timeout = httpx.USE_CLIENT_DEFAULT if learned is None else learned.seconds
                resp = await self._client.get(path, params=params, timeout=timeout)
                took = time.monotonic() - started
        except httpx.TimeoutException as e:
            if learned is None:
                raise SlurmUnavailable(f"slurmrestd {self.config.url}{path}: {e!r}") from e
            allowed = learned.seconds
            if await self._answers_ping():
                learned.timed_out()  # alive, only slower than its last read: more time
                after = f"it answers a ping: the next read may take {learned.seconds:g} s"
            else:
                after = "no answer to a ping either"
            raise SlurmUnavailable(
                f"slurmrestd {self.config.url}{path}: no answer within {allowed:g} s ({after})"
            ) from e
        except httpx.HTTPError as e:
            raise SlurmUnavailable(f"slurmrestd {self.config.url}{path}: {e!r}") from e
        if since is not None and resp.status_code == 304:
            raise Unchanged(path)  # not a full read: teaches the allowance nothing
        if learned is not None and resp.status_code == 200:
            learned.succeeded(took)
        if resp.status_code != 200:
            raise Refused(f"slurmrestd {path}: HTTP {resp.status_code} {_why(resp)}")
        return resp

    async def served_versions(self) -> list[str]:
        """The ``/slurm/vX`` versions the server describes in ``/openapi``."""
        data = await self._get("/openapi")
        found = {
            m.group(1)
            for p in data.get("paths", {})
            if (m := re.match(r"^/slurm/(v\d+\.\d+\.\d+)/", p)) is not None
        }
        return sorted(found, key=version_key, reverse=True)

    async def connect(self) -> str:
        """Pick the newest version this module reads that slurmrestd answers a ping on.

        Each try is a ping (under a kilobyte; a version slurmrestd does not serve is a 404),
        not ``/openapi``, which is 660 KB on 24.11: on a loaded node reading it can take
        longer than a request's timeout, and a client retrying at every pass asks slurmrestd
        for the whole document each time (on the emulated machines the operator's connect
        then never succeeded; with pings it did at once). ``/openapi`` is read only when no
        version answers, to say what the server does serve."""
        for version in SUPPORTED_VERSIONS:
            try:
                await self._get(f"/slurm/{version}/{_collection(version, 'ping')}")
            except Refused:
                continue  # not served here (or refused): the next older one
            self.version = version
            return version
        served = await self.served_versions()
        usable = [v for v in served if v in SUPPORTED_VERSIONS]
        if not usable:
            raise SlurmUnavailable(
                f"slurmrestd serves {served}; this gpufleet reads {list(SUPPORTED_VERSIONS)}"
            )
        raise SlurmUnavailable(f"no slurmrestd version of {usable} answers ping")

    def _path(self, tail: str) -> str:
        if self.version is None:
            raise SlurmUnavailable("slurmrestd version not negotiated; call connect() first")
        return f"/slurm/{self.version}/{tail}"

    def _list(self, name: str) -> str:
        """A collection's path (``nodes/`` from v0.0.40)."""
        if self.version is None:
            return self._path(name)  # raises: not negotiated
        return self._path(_collection(self.version, name))

    async def ping(self) -> dict[str, Any]:
        return await self._get(self._list("ping"))

    async def _answers_ping(self) -> bool:
        """Whether slurmrestd answers a ping within ``timeout_s``: after a collection read
        ran out, it tells a server that is slower than before (more time next read) from
        one that is frozen (the same allowance: a frozen server is then noticed as fast on
        every poll, not after ever longer waits)."""
        try:
            await self.ping()
        except SlurmUnavailable:
            return False
        return True

    async def _read_collection(
        self, name: str, each: Callable[[Any], T | None], since: float | None = None
    ) -> list[T]:
        """Collection ``name``, each element decoded by ``each`` (None: left out), off the
        event loop: a 12,500-node ``/nodes`` is 21 MB of JSON, 400 ms of parsing here, and
        a fault arriving meanwhile would wait for it (decision 0221). The thread builds new
        objects from the answer's bytes only; the caller swaps them in on the loop."""
        path = self._list(name)
        resp = await self._response(path, learned=self.collection_timeout(name), since=since)
        return await asyncio.to_thread(_decoded_collection, path, resp.content, name, each)

    async def nodes(self) -> dict[str, slurm_sync.SlurmView]:
        """Every node's view. ``/nodes`` rather than ``/node/{name}``: see :meth:`node`."""
        return dict(await self._read_collection("nodes", _named_view))

    async def nodes_if_changed(self, since: float) -> dict[str, slurm_sync.SlurmView] | None:
        """Every node's view if any node changed after ``since`` (epoch seconds, slurmctld's
        clock), else None: slurmctld answers "no change" without packing 12,500 nodes and
        the syncer parses nothing."""
        views = await self._collection_if_changed("nodes", _named_view, since)
        return None if views is None else dict(views)

    async def _collection_if_changed(
        self, name: str, each: Callable[[Any], T | None], since: float
    ) -> list[T] | None:
        """Collection ``name`` if it changed after ``since``, else None (304).

        Slurm 22.05 refuses (500, "Unspecified error") a read with ``update_time`` when the
        nodes changed but the partitions it also loads did not; a refused read is made
        again in full (one that gets no answer is not: Slurm is away)."""
        try:
            return await self._read_collection(name, each, since)
        except Unchanged:
            return None
        except Refused:
            return await self._read_collection(name, each)

    async def node(self, name: str) -> slurm_sync.SlurmView | None:
        """One node, fresh (before a write). In 22.05 this endpoint may report the base
        state of a partly used node as ``allocated`` instead of ``mixed``; the flags and
        reason, which the decisions use, are right."""
        data = await self._get(self._path(f"node/{name}"))
        for raw in data.get("nodes") or []:
            if raw.get("name") == name:
                return node_view(raw)
        return None

    async def running_jobs(self) -> list[slurm_sync.JobView]:
        """Jobs holding nodes (finished jobs stay in ``/jobs`` for MinJobAge: filtered
        here, but for those that asked for a departure notice, kept in
        :attr:`ended_jobs`)."""
        running, self.ended_jobs = split_jobs(await self._read_collection("jobs", _job_entry))
        return running

    async def running_jobs_if_changed(self, since: float) -> list[slurm_sync.JobView] | None:
        """:meth:`running_jobs` if any job changed after ``since``, else None."""
        got: list[JobEntry] | None = await self._collection_if_changed("jobs", _job_entry, since)
        if got is None:
            return None
        running, self.ended_jobs = split_jobs(got)
        return running

    # -- writes (v0.0.40+) ---------------------------------------------------------

    async def _send(
        self, method: str, path: str, body: Any | None = None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """A write: no answer is SlurmUnavailable, an answer with errors SlurmCommandFailed.
        ``timeout``: this request's, instead of ``timeout_s``."""
        what = [method, f"{self.config.url}{path}"]
        limit = httpx.USE_CLIENT_DEFAULT if timeout is None else timeout
        try:
            async with self._slots:
                resp = await self._client.request(method, path, json=body, timeout=limit)
        except httpx.HTTPError as e:
            raise SlurmUnavailable(f"slurmrestd {method} {path}: {e!r}") from e
        try:
            data = resp.json()
        except ValueError:
            raise SlurmUnavailable(
                f"slurmrestd {method} {path}: HTTP {resp.status_code} {resp.text[:200]!r}"
            ) from None
        errors = data.get("errors") if isinstance(data, dict) else None
        if errors:
            text = "; ".join(
                f"{e.get('error') or ''} ({e.get('description') or ''})".strip()
                if isinstance(e, Mapping)
                else str(e)
                for e in errors
            )
            raise SlurmCommandFailed(what, resp.status_code, text)
        if resp.status_code != 200 or not isinstance(data, dict):
            raise SlurmUnavailable(f"slurmrestd {method} {path}: HTTP {resp.status_code}")
        return data

    def _require_updates(self) -> None:
        if not self.updates_nodes:
            raise SlurmUnavailable(
                f"slurmrestd {self.version} has no node update (v0.0.40 and later do)"
            )

    async def update_nodes(self, node: str | Sequence[str], body: Mapping[str, Any]) -> None:
        """``POST node/{name}`` for one node, ``POST nodes/`` with the names for several."""
        self._require_updates()
        if isinstance(node, str):
            await self._send("POST", self._path(f"node/{node}"), dict(body))
            return
        if not node:
            raise ValueError("no node names")
        await self._send("POST", self._list("nodes"), {**body, "name": list(node)})

    async def drain(self, node: str | Sequence[str], reason: str) -> None:
        await self.update_nodes(node, {"state": ["DRAIN"], "reason": reason})

    async def undrain(self, node: str | Sequence[str]) -> None:
        """Clear the DRAIN flag only, like ``scontrol update state=UNDRAIN``."""
        await self.update_nodes(node, {"state": ["UNDRAIN"]})

    async def reconfigure(self) -> None:
        self._require_updates()
        await self._send(
            "GET", self._list("reconfigure"), timeout=self.config.reconfigure_timeout_s
        )


def _checked(path: str, data: Any) -> dict[str, Any]:
    """A read's decoded answer, if it is an object without ``errors``."""
    if not isinstance(data, dict):
        raise SlurmUnavailable(f"slurmrestd {path}: unexpected {type(data).__name__}")
    errors = data.get("errors") or []
    if errors:
        raise SlurmUnavailable(f"slurmrestd {path}: {errors}")
    return data


def _decoded_collection(
    path: str, body: bytes, name: str, each: Callable[[Any], T | None]
) -> list[T]:
    """A collection's answer decoded (in a thread): its ``name`` array element by element,
    each turned into its view at once (:func:`_loads_in_pieces`). An answer that is not
    the collection's shape is no answer (fail closed)."""
    try:
        data = _checked(path, _loads_in_pieces(body.decode("utf-8"), name, each))
        items = data.get(name) or []
        if not isinstance(items, list):
            raise TypeError(f"{name} is a {type(items).__name__}")
    except SlurmUnavailable:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # a UnicodeError too
        raise SlurmUnavailable(f"slurmrestd {path}: not a {name} answer ({e!r})") from e
    return [item for item in items if item is not None]


def _loads_in_pieces(text: str, key: str, each: Callable[[Any], Any]) -> Any:
    """``json.loads(text)``, except that the array under the top-level ``key`` is decoded
    one element at a time, each passed through ``each`` before the next is read.

    One ``json.loads`` of a 12,500-node ``/nodes`` runs 300 ms in C without letting go of
    the GIL, so even in a thread it stops the event loop that long; between two elements
    the loop's thread can take the GIL (the interpreter's switch interval, 5 ms). And
    each element's dicts are freed as soon as its view is made, so the parse allocates
    little that lives: the collector's full passes over the process's heap, which stop
    every thread, are not set off by 12,500 nodes' dicts piling up (with ``json.loads``
    they were, several times per read). Malformed text raises ValueError."""
    # One scanner per call (the C one of json.loads): its key memo is not shared.
    scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
    try:
        i = _space(text, 0)
        if not text.startswith("{", i):
            return json.loads(text)  # not an object: decoded whole (and refused later)
        out: dict[str, Any] = {}
        i = _space(text, i + 1)
        while text[i] != "}":
            if text[i] != '"':
                raise ValueError(f"a key expected at {i}")
            name, i = scan(text, i)
            i = _space(text, i)
            if text[i] != ":":
                raise ValueError(f"':' expected at {i}")
            i = _space(text, i + 1)
            if name == key and text[i] == "[":
                out[name], i = _array_in_pieces(text, i, scan, each)
            else:
                out[name], i = scan(text, i)
            i = _space(text, i)
            if text[i] == ",":
                i = _space(text, i + 1)
                if text[i] == "}":
                    raise ValueError(f"a key expected at {i}")
            elif text[i] != "}":
                raise ValueError(f"',' or '}}' expected at {i}")
        if _space(text, i + 1) != len(text):
            raise ValueError(f"extra data at {i + 1}")
        return out
    except (StopIteration, IndexError) as e:  # scan_once's "no value here"; text ran out
        raise ValueError(f"malformed JSON ({e!r})") from None


def _array_in_pieces(
    text: str,
    i: int,
    scan: Callable[[str, int], tuple[Any, int]],
    each: Callable[[Any], Any],
) -> tuple[list[Any], int]:
    """The array starting at ``text[i]`` (``[``), element by element through ``each``,
    and where it ends."""
    items: list[Any] = []
    i = _space(text, i + 1)
    if text[i] == "]":
        return items, i + 1
    while True:
        item, i = scan(text, i)
        items.append(each(item))
        i = _space(text, i)
        if text[i] == "]":
            return items, i + 1
        if text[i] != ",":
            raise ValueError(f"',' or ']' expected at {i}")
        i = _space(text, i + 1)


def _space(text: str, i: int) -> int:
    """Where the JSON whitespace starting at ``text[i]`` ends."""
    return _SPACE.match(text, i).end()  # type: ignore[union-attr]  # always matches


_SPACE = re.compile(r"[ \t\n\r]*")


def _named_view(raw: Mapping[str, Any]) -> tuple[str, slurm_sync.SlurmView]:
    """One node of a ``/nodes`` answer: its name and view."""
    return str(raw["name"]), node_view(raw)


def _job_entry(raw: Mapping[str, Any]) -> JobEntry | None:
    """One job of a ``/jobs`` answer, if it holds nodes, or if it ended after asking for
    a departure notice (whether it is requeued depends on how it ended)."""
    if is_running(raw):
        return job_view(raw)
    if job_state(raw) != "PENDING" and departure.wants_notice(str(raw.get("comment") or "")):
        return ended_job(raw)  # a pending one is left out: queued, its record of no use
    return None


class Refused(SlurmUnavailable):
    """slurmrestd answered a read with an HTTP error: it is there, but refused this one."""


class Unchanged(Exception):
    """slurmrestd answered 304 Not Modified to a read with ``update_time``: nothing in the
    collection changed since. Internal to this module (the public reads return None)."""


def _why(resp: httpx.Response) -> str:
    """What a refusing slurmrestd said: its ``errors`` (after a long ``meta`` block that a
    cut of the body would show instead), else the start of the body."""
    try:
        errors = resp.json().get("errors")
    except (ValueError, AttributeError):
        errors = None
    if errors:
        return "; ".join(
            f"{e.get('error') or ''} ({e.get('error_number', '')}: {e.get('description') or ''})"
            if isinstance(e, Mapping)
            else str(e)
            for e in errors
        )[:500]
    return repr(resp.text[:200])


def _collection(version: str, name: str) -> str:
    """A collection's path segment: ``nodes`` up to v0.0.38, ``nodes/`` from v0.0.40."""
    return f"{name}/" if version_key(version) >= NODE_UPDATES_SINCE else name
