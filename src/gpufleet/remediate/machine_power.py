"""Power a Machine on to network-boot and join: one shared sequence for every caller.

``gpufleet machines power-on`` (an operator's Day 0), the local cluster's
power button and the controller's boot watchdog (a retry of a stalled boot)
all do the same, in this order:

1. read the Machine and its BMC Secret (``spec.bmc.credentialsSecret``); the
   BMC is the endpoint stored in the Secret with its credentials, and a Machine
   whose ``spec.bmc.endpoint`` says otherwise is refused (a Warning Event
   ``BmcEndpointMismatch`` on the Machine; nothing powered, nothing recorded);
2. check the BMC is this machine's (its ``SerialNumber`` equals the Machine's
   serial, decision 0073): a mismatch powers nothing and records nothing;
3. **record before acting**: re-arm the Machine (its boot gets a new token; the
   previous one is revoked) and write ``status.boot`` (requested, attempt N,
   in progress) -- a crash after this and before the power action costs one
   stall of the watchdog, never a second power action for one decision;
4. set a one-time network boot, then one Reset: ``On`` if the machine is off,
   else ``ForceRestart``. A Reset whose answer is lost is not repeated (the
   watchdog sees the boot stall if it did not happen).

A Machine that already has a Node is refused here: once a machine has joined,
its power belongs to its Node's lifecycle (drain, budget, ladder).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from gpufleet.domain import boot_watch, enrollment
from gpufleet.remediate import redfish
from gpufleet.remediate.bmc_tls import BmcTls
from gpufleet.remediate.identity import (
    BmcIdentity,
    ExpectedIdentity,
    endpoint_problem,
    mismatches,
)
from gpufleet.remediate.steps import Bmc

log = logging.getLogger("gpufleet.machines")


class MachineStore(Protocol):
    """What the sequence needs from the cluster (``gpufleet.kubeapi.machines.MachineStore``)."""

    async def machine(self, name: str) -> Mapping[str, Any]:
        """The Machine object."""
        ...

    async def secret(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's data, decoded."""
        ...

    async def record_boot(
        self, name: str, *, by: str, reason: str, now: float, status: Mapping[str, Any]
    ) -> None:
        """Re-arm the Machine with ``status`` in the same patch; revoke the old token."""
        ...

    async def refused(self, name: str, *, reason: str, message: str, now: float) -> None:
        """Say on the Machine (a Warning Event) why its BMC was not used."""
        ...


class PowerRefused(Exception):
    """Nothing was done to the machine (and nothing recorded), for the reason given."""


class BmcEndpointMismatch(PowerRefused):
    """The Machine's BMC endpoint is not the one its Secret's credentials belong to."""

    reason = "BmcEndpointMismatch"


@dataclass(frozen=True, slots=True)
class PowerOn:
    """What :func:`network_boot` did."""

    machine: str
    reset_type: str
    attempt: int


async def machine_credentials(
    store: MachineStore, body: Mapping[str, Any]
) -> redfish.BmcCredentials:
    """The Machine's BMC credentials, from the Secret its spec names.

    The endpoint is the Secret's, never the Machine's alone: raises
    :class:`BmcEndpointMismatch` when they disagree or the Secret names none.
    """
    name = str(body["metadata"]["name"])
    bmc = (body.get("spec") or {}).get("bmc") or {}
    ref = str(bmc.get("credentialsSecret") or "")
    namespace, _, secret = ref.partition("/")
    if not namespace or not secret:
        raise PowerRefused(f"Machine {name} names no BMC Secret (namespace/name)")
    data = await store.secret(namespace, secret)
    problem = endpoint_problem(name, str(bmc.get("endpoint") or ""), ref, data.get("endpoint"))
    if problem is not None:
        raise BmcEndpointMismatch(problem)
    return redfish.BmcCredentials(
        endpoint=str(data["endpoint"]).strip(),
        username=data.get("username", ""),
        password=data.get("password", ""),
        tls=BmcTls.from_secret(data, ref),
    )


OpenBmc = Callable[[redfish.BmcCredentials, str], AbstractAsyncContextManager[Bmc]]
"""Opens a BMC that can act (only the gate holds one: docs/decisions/0139)."""


def identity_problems(body: Mapping[str, Any], seen: BmcIdentity) -> tuple[str, ...]:
    """Why this BMC may not be the Machine's (empty: verified by its serial)."""
    name = str(body["metadata"]["name"])
    spec = body.get("spec") or {}
    expected = ExpectedIdentity(
        node=name,
        machine=name,
        serial=str(spec.get("serial") or "") or None,
    )
    return mismatches(expected, seen)


async def network_boot(
    store: MachineStore,
    name: str,
    *,
    open_bmc: OpenBmc,
    by: str,
    now: float,
    attempt: int = 1,
    why: str = "",
) -> PowerOn:
    """Record, then power the Machine on (or restart it) to boot once from the network.

    Called by the gate only (it alone has ``open_bmc``), after it has proven that
    no Node of the machine exists. Raises :class:`PowerRefused` (nothing done),
    the port's errors (nothing done if raised before the record; after it, the
    boot stalls and is retried), or :class:`~gpufleet.remediate.redfish.RedfishError`
    from the BMC.
    """
    body = await store.machine(name)
    status = body.get("status") or {}
    if status.get("node"):
        raise PowerRefused(
            f"Machine {name} has joined as Node {status['node']}: its power belongs to the "
            "Node's lifecycle (drain, budget, remediation ladder)"
        )
    try:
        creds = await machine_credentials(store, body)
    except BmcEndpointMismatch as exc:
        await store.refused(name, reason=exc.reason, message=str(exc), now=now)
        raise
    async with open_bmc(creds, name) as bmc:
        problems = identity_problems(body, await bmc.identity())
        if problems:
            raise PowerRefused(f"BMC of Machine {name} not verified: {'; '.join(problems)}")
        reason = why or f"power-on by {by} (attempt {attempt})"
        await store.record_boot(
            name,
            by=by,
            reason=reason,
            now=now,
            status=boot_watch.requested_status(by=by, at=now, attempt=attempt, why=why),
        )
        await bmc.set_one_time_boot("Pxe")
        state = await bmc.power_state()
        reset_type = "On" if state == "Off" else "ForceRestart"
        log.info(
            "machine=%s %s by %s (attempt %d, was %s) at %s",
            name,
            reset_type,
            by,
            attempt,
            state,
            enrollment.rfc3339(now),
        )
        await bmc.reset(reset_type)
    return PowerOn(name, reset_type, attempt)
