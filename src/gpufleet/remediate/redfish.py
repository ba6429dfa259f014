"""A Redfish client for the remediation steps that need a BMC.

Reboot, power cycle and reimage (one-time network boot, then power cycle) go
through the node's BMC over DMTF Redfish. The client discovers the
ComputerSystem from ``/redfish/v1/Systems`` instead of assuming a path, reads
the reset types the BMC allows (``ResetType@Redfish.AllowableValues`` or the
action's ``ResetActionInfo``) and falls back where a BMC lacks one: no
``PowerCycle`` -> ``ForceOff`` then ``On``; ``GracefulRestart`` refused ->
``ForceRestart``.

Every request has a timeout. Reads (GET) and idempotent writes (the boot
override PATCH) are retried a bounded number of times on transport errors and
5xx answers (``retry_delays``); 4xx answers never. A ``ComputerSystem.Reset``
POST is sent **once**: it is not idempotent (a BMC that power cycled and then
answered 500 would power cycle again), so a lost answer raises
:class:`BmcOutcomeUnknown` and the caller reads the BMC to learn what happened
(:mod:`gpufleet.remediate.evidence`). Errors are typed and name the BMC, so an
Event can say which machine refused what.

TLS is verified as the BMC's Secret says (:mod:`gpufleet.remediate.bmc_tls`): its
``ca.crt``, else the CA bundle the process was given, else the default trusted CAs;
its ``certSha256`` pin is checked before any request is written. A refused
certificate is a :class:`BmcTlsError`, never retried: nothing was sent.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import httpx

from gpufleet.remediate import bmc_tls
from gpufleet.remediate.bmc_tls import BmcTls
from gpufleet.remediate.evidence import RESET_WORDS, ResetEvidence
from gpufleet.remediate.identity import BmcIdentity

log = logging.getLogger(__name__)

RETRY_DELAYS: tuple[float, ...] = (0.5, 1.0, 2.0)
"""Pauses between attempts of one request: 4 attempts, about 3.5 s in all."""
REQUEST_TIMEOUT_S = 10.0
"""Per request; a BMC that takes longer is treated as unreachable."""
POWER_WAIT_S = 60.0
"""How long to wait for a power state to be reached after ForceOff / On."""
IDEMPOTENT = frozenset({"GET", "HEAD", "PATCH", "PUT", "DELETE"})
"""Methods the client may repeat after a lost answer; a POST (an action) is never repeated."""


class RedfishError(Exception):
    """A BMC could not do what was asked. ``bmc`` names it (node and endpoint)."""

    def __init__(self, bmc: str, message: str) -> None:
        super().__init__(f"BMC {bmc}: {message}")
        self.bmc = bmc


class BmcUnreachable(RedfishError):
    """No answer (connection refused, timeout, 5xx after every retry)."""


class BmcAuthError(RedfishError):
    """The BMC refused the credentials (401/403): fix the Secret."""


class BmcTlsError(RedfishError):
    """The BMC's certificate was refused, or the Secret's TLS keys cannot be used: no
    request was sent (so nothing was done), and the message names the key to set. Never
    retried: the answer would be the same (docs/decisions/0211)."""


class BmcRejected(RedfishError):
    """The BMC answered 4xx (or 501) to a request, or lacks a needed resource or
    action: nothing was done."""


class BmcOutcomeUnknown(RedfishError):
    """An action was sent but its answer was lost (timeout, broken connection, 5xx):
    it may or may not have been carried out. Never answered by posting again."""

    def __init__(self, bmc: str, message: str, *, status: int | None = None) -> None:
        super().__init__(bmc, message)
        self.status = status


@dataclass(frozen=True)
class BmcCredentials:
    """Where a node's BMC is and how to log in (from the Secret the Node names)."""

    endpoint: str
    username: str
    password: str = field(repr=False)
    tls: BmcTls = field(default_factory=BmcTls, repr=False)
    """The Secret's TLS keys (``ca.crt``, ``certSha256``, ``insecureSkipVerify``)."""


@dataclass(frozen=True, slots=True)
class SystemInfo:
    """What the client learnt about the ComputerSystem."""

    path: str
    reset_target: str
    reset_types: tuple[str, ...]
    power_state: str
    log_services: str | None = None
    """The system's ``LogServices`` collection, if it has one."""


ADDRESS_MAP: dict[str, str] = {}
"""BMC host -> the host this process reaches it at (``--bmc-address-map``): Machines and
BMC Secrets name a BMC as the provisioning network sees it; a controller on another
network (a NAT, a pod on a machine of the local cluster) reaches the same BMC at another
address. Set once at start-up, before any client is made."""


def set_address_map(pairs: Mapping[str, str]) -> None:
    ADDRESS_MAP.clear()
    ADDRESS_MAP.update(pairs)


def reachable(endpoint: str) -> str:
    """``endpoint`` with its host replaced as :data:`ADDRESS_MAP` says (else unchanged)."""
    if not ADDRESS_MAP:
        return endpoint
    url = httpx.URL(endpoint)
    host = ADDRESS_MAP.get(url.host)
    return str(url.copy_with(host=host)) if host else endpoint


def parse_address_map(text: str) -> dict[str, str]:
    """``FROM=TO[,FROM=TO]`` -> {FROM: TO}; ValueError naming a bad pair."""
    pairs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        old, sep, new = part.partition("=")
        if not sep or not old.strip() or not new.strip() or "/" in part or ":" in part:
            raise ValueError(f"{part!r}: expected FROM=TO, two host names or IPv4 addresses")
        pairs[old.strip()] = new.strip()
    return pairs


class RedfishClient:
    """One BMC, read only. Use as ``async with RedfishClient(creds, name=node) as bmc:``.

    It reads what a BMC says (identity, power state, reset evidence) and can do
    nothing to the machine: the requests that can (a Reset, a boot override) are
    :class:`gpufleet.remediate.power.RedfishPower`'s, which only the gate holds
    (docs/decisions/0139).
    """

    def __init__(
        self,
        creds: BmcCredentials,
        *,
        name: str = "",
        timeout_s: float = REQUEST_TIMEOUT_S,
        retry_delays: Sequence[float] = RETRY_DELAYS,
        power_wait_s: float = POWER_WAIT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        default_ca_file: str | None = None,
    ) -> None:
        self.creds = creds
        self.name = f"{name} ({creds.endpoint})" if name else creds.endpoint
        self._retry_delays = tuple(retry_delays)
        self._power_wait_s = power_wait_s
        self._default_ca_file = default_ca_file
        url = httpx.URL(creds.endpoint)
        base = reachable(creds.endpoint)
        # Reached at another address (--bmc-address-map): the certificate is still
        # checked against the host the Secret names.
        self._extensions = {"sni_hostname": url.host} if base != creds.endpoint else {}
        self._refusal = ""
        verify: ssl.SSLContext | bool = True
        try:
            verify = bmc_tls.client_context(
                creds.tls, scheme=url.scheme, default_ca_file=default_ca_file
            )
        except bmc_tls.TlsConfigError as exc:
            self._refusal = f"TLS: {exc}; nothing sent"
        else:
            if creds.tls.skips_verification() and url.scheme == "https":
                log.warning(
                    "BMC %s: its certificate is NOT verified (%s is true in Secret %s): "
                    "whoever answers at that address gets the BMC password; set %s or %s "
                    "there instead",
                    self.name,
                    bmc_tls.KEY_INSECURE,
                    creds.tls.secret,
                    bmc_tls.KEY_CA,
                    bmc_tls.KEY_PIN,
                )
        self._http = httpx.AsyncClient(
            base_url=base.rstrip("/"),
            auth=(creds.username, creds.password),
            timeout=timeout_s,
            transport=transport,
            verify=verify,
            headers={"Accept": "application/json", "OData-Version": "4.0"},
        )
        self._system: SystemInfo | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ---------------------------------------------------------------- transport

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request; repeated on a lost answer only if ``method`` is idempotent."""
        if self._refusal:
            raise BmcTlsError(self.name, self._refusal)
        if method not in IDEMPOTENT:
            return await self._send_once(method, path, body)
        last = ""
        for delay in (*self._retry_delays, None):
            try:
                resp = await self._http.request(
                    method, path, json=body, extensions=self._extensions
                )
            except httpx.HTTPError as exc:
                self._check_certificate(exc)
                last = f"{method} {path}: {type(exc).__name__}: {exc}".rstrip(": ")
            else:
                if resp.status_code < 500 or resp.status_code == 501:
                    return self._answer(method, path, resp)
                last = f"{method} {path}: HTTP {resp.status_code} {_message(resp)}"
            if delay is None:
                break
            await asyncio.sleep(delay)
        raise BmcUnreachable(self.name, f"{last} (after {len(self._retry_delays) + 1} attempts)")

    async def _send_once(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """A non-idempotent request: sent once, whatever happens."""
        try:
            resp = await self._http.request(method, path, json=body, extensions=self._extensions)
        except httpx.ConnectError as exc:
            self._check_certificate(exc)
            # No connection was made, so the request never left: nothing was done.
            raise BmcUnreachable(
                self.name, f"{method} {path}: {type(exc).__name__}: {exc}"
            ) from exc
        except httpx.HTTPError as exc:
            raise BmcOutcomeUnknown(
                self.name, f"{method} {path}: {type(exc).__name__}: {exc}".rstrip(": ")
            ) from exc
        if resp.status_code >= 500 and resp.status_code != 501:
            raise BmcOutcomeUnknown(
                self.name,
                f"{method} {path}: HTTP {resp.status_code} {_message(resp)}".rstrip(),
                status=resp.status_code,
            )
        return self._answer(method, path, resp)

    def _check_certificate(self, exc: httpx.HTTPError) -> None:
        """A refused certificate is a configuration to fix, not a BMC to wait for: said
        at once, with the key to set, and never retried."""
        refused = bmc_tls.refused_certificate(exc)
        if refused is not None:
            raise BmcTlsError(
                self.name, bmc_tls.explain(refused, self.creds.tls, self._default_ca_file)
            ) from exc

    def _answer(self, method: str, path: str, resp: httpx.Response) -> Any:
        if resp.status_code in (401, 403):
            raise BmcAuthError(
                self.name, f"{method} {path}: HTTP {resp.status_code}; check the Secret"
            )
        if resp.status_code >= 400:
            raise BmcRejected(
                self.name, f"{method} {path}: HTTP {resp.status_code} {_message(resp)}"
            )
        return resp.json() if resp.content else None

    # ---------------------------------------------------------------- discovery

    async def system(self, *, refresh: bool = False) -> SystemInfo:
        """Find the ComputerSystem and its reset action (cached)."""
        if self._system is not None and not refresh:
            return self._system
        root = await self._request("GET", "/redfish/v1")
        systems_path = _link(root, "Systems")
        if systems_path is None:
            raise BmcRejected(self.name, "the service root has no Systems collection")
        members = (await self._request("GET", systems_path)).get("Members") or []
        if not members:
            raise BmcRejected(self.name, f"{systems_path} lists no ComputerSystem")
        if len(members) > 1:
            raise BmcRejected(
                self.name, f"{systems_path} lists {len(members)} systems; expected one per node"
            )
        path = members[0]["@odata.id"]
        system = await self._request("GET", path)
        action = (system.get("Actions") or {}).get("#ComputerSystem.Reset")
        if not action or "target" not in action:
            raise BmcRejected(self.name, f"{path} has no ComputerSystem.Reset action")
        types = action.get("ResetType@Redfish.AllowableValues")
        if not types and action.get("@Redfish.ActionInfo"):
            info = await self._request("GET", action["@Redfish.ActionInfo"])
            for param in info.get("Parameters") or []:
                if param.get("Name") == "ResetType":
                    types = param.get("AllowableValues")
        self._system = SystemInfo(
            path=path,
            reset_target=action["target"],
            reset_types=tuple(types or ()),
            power_state=str(system.get("PowerState", "Unknown")),
            log_services=_link(system, "LogServices"),
        )
        return self._system

    async def _system_now(self) -> tuple[SystemInfo, Any]:
        """The discovered system and its ComputerSystem resource, read now."""
        info = await self.system()
        return info, await self._request("GET", info.path)

    async def identity(self) -> BmcIdentity:
        """What the ComputerSystem says about itself, read now (never cached)."""
        _, data = await self._system_now()
        return BmcIdentity(
            serial=_text(data.get("SerialNumber")),
            uuid=_text(data.get("UUID")),
            hostname=_text(data.get("HostName")),
        )

    async def evidence(self) -> ResetEvidence:
        """What a reset would change: LastResetTime, else the logs, and PowerState."""
        info, data = await self._system_now()
        power = _text(data.get("PowerState"))
        last = _text(data.get("LastResetTime"))
        if last is not None or info.log_services is None:
            return ResetEvidence(last_reset_time=last, power_state=power)
        newest, resets = await self._log_entries(info.log_services)
        return ResetEvidence(power_state=power, log_newest=newest, log_resets=resets)

    async def _log_entries(self, services_path: str) -> tuple[str | None, tuple[str, ...]]:
        """Newest entry time and the times of reset-like entries, first page of each log.

        A BMC without readable logs gives (None, ()): no evidence either way.
        """
        newest: str | None = None
        resets: list[str] = []
        try:
            services = await self._request("GET", services_path)
            for member in (services or {}).get("Members") or []:
                service = await self._request("GET", member["@odata.id"])
                entries_path = _link(service, "Entries")
                if entries_path is None:
                    continue
                entries = await self._request("GET", entries_path)
                for entry in (entries or {}).get("Members") or []:
                    created = _text(entry.get("Created"))
                    if created is None:
                        continue
                    newest = max(newest or created, created)
                    words = f"{entry.get('MessageId', '')} {entry.get('Message', '')}".lower()
                    if any(w in words for w in RESET_WORDS):
                        resets.append(created)
        except (RedfishError, KeyError, TypeError, AttributeError):
            return None, ()
        return newest, tuple(resets)

    async def serial_number(self) -> str | None:
        """The ComputerSystem's ``SerialNumber`` (None if the BMC does not report one)."""
        return (await self.identity()).serial

    async def power_state(self) -> str:
        _, data = await self._system_now()
        return str(data.get("PowerState", "Unknown"))

    def allows(self, reset_type: str) -> bool:
        """Whether the discovered system lists ``reset_type`` (or lists none at all)."""
        info = self._system
        return info is None or not info.reset_types or reset_type in info.reset_types

    async def wait_power(self, state: str) -> None:
        """Poll until PowerState reads ``state``; BmcUnreachable after ``power_wait_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._power_wait_s
        current = ""
        while loop.time() < deadline:
            current = await self.power_state()
            if current == state:
                return
            await asyncio.sleep(0.5)
        raise BmcUnreachable(
            self.name,
            f"PowerState still {current} {self._power_wait_s:g}s after asking for {state}",
        )


def _link(resource: Any, key: str) -> str | None:
    value = resource.get(key) if isinstance(resource, dict) else None
    if isinstance(value, dict) and isinstance(value.get("@odata.id"), str):
        return str(value["@odata.id"])
    return None


def _text(value: Any) -> str | None:
    """A property as text; None when absent or empty (a BMC that does not report it)."""
    if value is None:
        return None
    return str(value).strip() or None


def _message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error", {})
        return str(err.get("message", ""))[:200]
    except ValueError:
        return resp.text[:200]
