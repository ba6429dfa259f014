"""A Redfish client for the remediation steps that need a BMC.

Reboot, power cycle and reimage (one-time network boot, then power cycle) go
through the node's BMC over DMTF Redfish. The client discovers the
ComputerSystem from ``/redfish/v1/Systems`` instead of assuming a path, reads
the reset types the BMC allows (``ResetType@Redfish.AllowableValues`` or the
action's ``ResetActionInfo``) and falls back where a BMC lacks one: no
``PowerCycle`` -> ``ForceOff`` then ``On``; ``GracefulRestart`` refused ->
``ForceRestart``.

Every request has a timeout; transport errors and 5xx answers are retried a
bounded number of times (``retry_delays``), 4xx answers never. Errors are
typed and name the BMC, so an Event can say which machine refused what.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_DELAYS: tuple[float, ...] = (0.5, 1.0, 2.0)
"""Pauses between attempts of one request: 4 attempts, about 3.5 s in all."""
REQUEST_TIMEOUT_S = 10.0
"""Per request; a BMC that takes longer is treated as unreachable."""
POWER_WAIT_S = 60.0
"""How long to wait for a power state to be reached after ForceOff / On."""


class RedfishError(Exception):
    """A BMC could not do what was asked. ``bmc`` names it (node and endpoint)."""

    def __init__(self, bmc: str, message: str) -> None:
        super().__init__(f"BMC {bmc}: {message}")
        self.bmc = bmc


class BmcUnreachable(RedfishError):
    """No answer (connection refused, timeout, 5xx after every retry)."""


class BmcAuthError(RedfishError):
    """The BMC refused the credentials (401/403): fix the Secret."""


class BmcRejected(RedfishError):
    """The BMC answered 4xx to a request, or lacks a needed resource or action."""


@dataclass(frozen=True)
class BmcCredentials:
    """Where a node's BMC is and how to log in (from the Secret the Node names)."""

    endpoint: str
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class SystemInfo:
    """What the client learnt about the ComputerSystem."""

    path: str
    reset_target: str
    reset_types: tuple[str, ...]
    power_state: str


class RedfishClient:
    """One BMC. Use as ``async with RedfishClient(creds, name=node) as bmc:``."""

    def __init__(
        self,
        creds: BmcCredentials,
        *,
        name: str = "",
        timeout_s: float = REQUEST_TIMEOUT_S,
        retry_delays: Sequence[float] = RETRY_DELAYS,
        power_wait_s: float = POWER_WAIT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.creds = creds
        self.name = f"{name} ({creds.endpoint})" if name else creds.endpoint
        self._retry_delays = tuple(retry_delays)
        self._power_wait_s = power_wait_s
        self._http = httpx.AsyncClient(
            base_url=creds.endpoint.rstrip("/"),
            auth=(creds.username, creds.password),
            timeout=timeout_s,
            transport=transport,
            headers={"Accept": "application/json", "OData-Version": "4.0"},
        )
        self._system: SystemInfo | None = None

    async def __aenter__(self) -> RedfishClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ---------------------------------------------------------------- transport

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        last = ""
        for delay in (*self._retry_delays, None):
            try:
                resp = await self._http.request(method, path, json=body)
            except httpx.HTTPError as exc:
                last = f"{method} {path}: {type(exc).__name__}: {exc}".rstrip(": ")
            else:
                if resp.status_code in (401, 403):
                    raise BmcAuthError(
                        self.name, f"{method} {path}: HTTP {resp.status_code}; check the Secret"
                    )
                if 400 <= resp.status_code < 500:
                    raise BmcRejected(
                        self.name, f"{method} {path}: HTTP {resp.status_code} {_message(resp)}"
                    )
                if resp.status_code < 400:
                    return resp.json() if resp.content else None
                last = f"{method} {path}: HTTP {resp.status_code} {_message(resp)}"
            if delay is None:
                break
            await asyncio.sleep(delay)
        raise BmcUnreachable(self.name, f"{last} (after {len(self._retry_delays) + 1} attempts)")

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
        )
        return self._system

    async def serial_number(self) -> str | None:
        """The ComputerSystem's ``SerialNumber`` (None if the BMC does not report one)."""
        info = await self.system()
        data = await self._request("GET", info.path)
        serial = data.get("SerialNumber")
        return str(serial) if serial else None

    async def power_state(self) -> str:
        info = await self.system()
        data = await self._request("GET", info.path)
        return str(data.get("PowerState", "Unknown"))

    # ------------------------------------------------------------------ actions

    async def reset(self, reset_type: str) -> None:
        """POST ComputerSystem.Reset; refuses types the BMC does not list."""
        info = await self.system()
        if info.reset_types and reset_type not in info.reset_types:
            raise BmcRejected(
                self.name,
                f"ResetType {reset_type} is not allowed (allowed: {', '.join(info.reset_types)})",
            )
        await self._request("POST", info.reset_target, {"ResetType": reset_type})

    def _allows(self, info: SystemInfo, reset_type: str) -> bool:
        return not info.reset_types or reset_type in info.reset_types

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

    async def reboot(self) -> str:
        """GracefulRestart, or ForceRestart if the BMC lacks or refuses it; returns which."""
        info = await self.system()
        if self._allows(info, "GracefulRestart"):
            try:
                await self.reset("GracefulRestart")
                return "GracefulRestart"
            except BmcRejected:
                pass
        await self.reset("ForceRestart")
        return "ForceRestart"

    async def power_cycle(self) -> str:
        """PowerCycle, or ForceOff + On where the BMC has no PowerCycle. Returns what was done."""
        info = await self.system()
        if self._allows(info, "PowerCycle"):
            await self.reset("PowerCycle")
            return "PowerCycle"
        await self.reset("ForceOff")
        await self.wait_power("Off")
        await self.reset("On")
        await self.wait_power("On")
        return "ForceOff+On"

    async def set_one_time_boot(self, target: str = "Pxe") -> None:
        """Boot once from ``target``; the next boot consumes the override."""
        info = await self.system()
        await self._request(
            "PATCH",
            info.path,
            {"Boot": {"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": "Once"}},
        )

    async def reimage(self) -> str:
        """One-time PXE boot, then a power cycle: the node boots its image afresh."""
        await self.set_one_time_boot("Pxe")
        done = await self.power_cycle()
        return f"Pxe once + {done}"


def _link(resource: Any, key: str) -> str | None:
    value = resource.get(key) if isinstance(resource, dict) else None
    if isinstance(value, dict) and isinstance(value.get("@odata.id"), str):
        return str(value["@odata.id"])
    return None


def _message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error", {})
        return str(err.get("message", ""))[:200]
    except ValueError:
        return resp.text[:200]
