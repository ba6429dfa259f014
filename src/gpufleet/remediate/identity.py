"""Is this BMC the node's BMC? Pure comparison, no I/O.

A power action sent to the wrong BMC takes down a healthy machine (someone
else's job) and leaves the faulty one as it was. The Node names its BMC only
indirectly (annotation -> Secret -> endpoint), and a copy-pasted annotation
or a recabled BMC port is enough to point it elsewhere. So before any power
action the controller reads the BMC's ComputerSystem and compares what it
says about itself with what the cluster knows about the node:

- with a Machine (Node label ``gpufleet.io/machine``): the BMC's
  ``SerialNumber`` must equal ``Machine.spec.serial`` (the inventory is the
  authority; a BMC that reports no serial cannot be verified), and the
  Secret's endpoint must be the Machine's ``spec.bmc.endpoint``;
- without a Machine: the BMC's ``HostName`` must name the node;
- in both cases, where the Node reports an SMBIOS system UUID
  (``status.nodeInfo.systemUUID``, read by the kubelet from the machine
  itself) and the BMC reports a ``UUID``, they must be the same machine.

Anything missing that the rule needs makes the check fail: unverifiable is
treated as a mismatch (fail closed).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BmcIdentity:
    """What a BMC's ComputerSystem says about itself (None: not reported)."""

    serial: str | None = None
    uuid: str | None = None
    hostname: str | None = None

    def describe(self) -> str:
        """One line for Events: every field, including the missing ones."""
        return (
            f"SerialNumber={self.serial or '-'} UUID={self.uuid or '-'} "
            f"HostName={self.hostname or '-'}"
        )


@dataclass(frozen=True, slots=True)
class ExpectedIdentity:
    """What the cluster knows about the node whose BMC is about to be used."""

    node: str
    machine: str | None = None
    """The Machine named by the Node's label; None when the Node has none."""
    machine_error: str | None = None
    """Why the Machine could not be read (missing, unreadable); checked first."""
    serial: str | None = None
    """``Machine.spec.serial``."""
    machine_endpoint: str | None = None
    """``Machine.spec.bmc.endpoint``."""
    endpoint: str | None = None
    """The endpoint the Node's Secret points at (what will be called)."""
    system_uuid: str | None = None
    """The Node's ``status.nodeInfo.systemUUID`` (empty on nodes without one)."""


def mismatches(expected: ExpectedIdentity, seen: BmcIdentity) -> tuple[str, ...]:
    """Why this BMC may not be the node's, in words; empty when it is verified."""
    if expected.machine_error:
        return (expected.machine_error,)
    problems: list[str] = []
    if expected.machine is not None:
        want = _norm(expected.serial)
        got = _norm(seen.serial)
        if not want:
            problems.append(f"Machine {expected.machine} has no serial to compare with")
        elif not got:
            problems.append("the BMC reports no SerialNumber: its machine cannot be verified")
        elif want != got:
            problems.append(
                f"the BMC reports SerialNumber {seen.serial}, Machine {expected.machine} "
                f"has {expected.serial}"
            )
        if (
            expected.machine_endpoint
            and expected.endpoint
            and _url(expected.machine_endpoint) != _url(expected.endpoint)
        ):
            problems.append(
                f"the Node's BMC Secret points at {expected.endpoint}, Machine "
                f"{expected.machine} has its BMC at {expected.machine_endpoint}"
            )
    elif not _same_host(seen.hostname, expected.node):
        problems.append(
            f"the BMC reports HostName {seen.hostname or '(none)'}, not {expected.node} "
            "(no Machine inventory to check its serial against)"
        )
    if expected.system_uuid and seen.uuid and not same_uuid(expected.system_uuid, seen.uuid):
        problems.append(
            f"the BMC reports UUID {seen.uuid}, the node's kubelet reports {expected.system_uuid}"
        )
    return tuple(problems)


def endpoint_problem(
    machine: str, machine_endpoint: str | None, secret: str, secret_endpoint: str | None
) -> str | None:
    """Why a BMC Secret's credentials may not be used for this Machine (None: they may).

    Credentials are bound to the endpoint stored with them in their Secret: they
    are sent there and nowhere else. A Machine that names a Secret and an
    endpoint of its own would otherwise receive another machine's BMC
    credentials at an address of its choosing (and power whatever answers
    there), so an endpoint that disagrees with the Secret's is refused, and so
    is a Secret that names no endpoint.
    """
    if not (secret_endpoint or "").strip():
        return (
            f"BMC Secret {secret} names no endpoint: credentials are used only at the "
            "endpoint stored with them (add the Secret's 'endpoint' key)"
        )
    assert secret_endpoint is not None
    if machine_endpoint and _url(machine_endpoint) != _url(secret_endpoint):
        return (
            f"Machine {machine} has its BMC at {machine_endpoint}, but its Secret {secret} "
            f"holds the credentials of {secret_endpoint}: refused (credentials go only to "
            "their own endpoint; correct spec.bmc.endpoint or spec.bmc.credentialsSecret)"
        )
    return None


def same_uuid(a: str, b: str) -> bool:
    """The same SMBIOS UUID, allowing for the mixed-endian encoding some firmware uses.

    SMBIOS stores the first three fields little-endian; some BMCs and kernels
    print them byte-swapped, so one machine can show two spellings.
    """
    try:
        ua, ub = uuid.UUID(a.strip()), uuid.UUID(b.strip())
    except ValueError:
        return _norm(a) == _norm(b)
    return ua == ub or ua.bytes_le == ub.bytes


def _same_host(hostname: str | None, node: str) -> bool:
    host = _norm(hostname)
    want = _norm(node)
    if not host or not want:
        return False
    return host == want or host.split(".", 1)[0] == want or want.split(".", 1)[0] == host


def _norm(value: str | None) -> str:
    return (value or "").strip().casefold()


def _url(value: str) -> str:
    return value.strip().rstrip("/").casefold()
