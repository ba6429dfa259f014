"""Is a machine's boot still on its way, stalled, or failed? The Day-0 watchdog's decisions.

A machine that was powered on to join through gpufleet (``gpufleet machines
power-on``, the local cluster's power button, the watchdog's own retry) has a
*boot in progress*, recorded in its Machine's ``status.boot`` before the power
action. Only such a boot is watched: a machine that network-boots by itself
(powered on by hand, or an iPXE request anyone can send) is served but never
watched, so nothing unauthenticated can make the watchdog power-cycle a BMC
(decision 0160).
Its progress is what the provisioning service and the cluster see, in order:

1. ``requested``: powered on; the firmware should ask for its iPXE script;
2. ``network-boot``: the script was served; the kernel, initrd and root image
   should boot to cloud-init, which asks for the user-data;
3. ``token-issued``: the user-data (and its join token) was served; ``kubeadm
   join`` should register a Node that becomes Ready;
4. joined: a Node of this machine is Ready after the boot was requested.

A stage that does not advance within ``stall_seconds`` is a *stall*, and the
stage says where to look: no iPXE request means firmware, boot order or the
provisioning network; no user-data means the image did not boot (missing or
corrupt image, a kernel panic, a crash); no Node means the join failed. A
stalled boot is retried by a power cycle with a one-time network boot and a
fresh token, at most ``attempts`` power-ons in all; then the boot has failed
and stays so until someone powers the machine on again (nothing loops).

Only machines with no Node are retried here: once a Node exists its lifecycle
(the remediation ladder, with its own timeouts and budget) owns its power.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpufleet.domain.enrollment import parse_rfc3339, rfc3339


class Stage(StrEnum):
    """How far a boot has come (each stage waits for the next)."""

    REQUESTED = "requested"
    NETWORK_BOOT = "network-boot"
    TOKEN_ISSUED = "token-issued"


STALL_REASONS: dict[Stage, tuple[str, str]] = {
    Stage.REQUESTED: (
        "NoNetworkBoot",
        "no iPXE request since the power-on: check the firmware's boot order (PXE on the "
        "listed MAC), the provisioning network and DHCP's boot file",
    ),
    Stage.NETWORK_BOOT: (
        "ImageDidNotBoot",
        "the iPXE script was served but cloud-init never asked for its user-data: the kernel, "
        "initrd or root image did not boot (missing or corrupt image, kernel panic, crash); "
        "see the machine's console",
    ),
    Stage.TOKEN_ISSUED: (
        "JoinDidNotComplete",
        "the join token was served but no Node of this machine became Ready: kubeadm join or "
        "the kubelet failed (apiserver unreachable, token refused, CSR not approved); see the "
        "machine's console or journal",
    ),
}
"""Per stage: the condition reason and what it means, for Events and ``status.boot``."""


@dataclass(frozen=True, slots=True)
class BootProgress:
    """One boot in progress, as its Machine's status records it (times: epoch seconds)."""

    requested_at: float
    attempt: int
    """Power-ons of this boot so far (1: the first)."""
    network_boot_at: float | None = None
    """When the iPXE script was last served."""
    token_at: float | None = None
    """When the join token was last issued."""

    @property
    def stage(self) -> Stage:
        """The furthest stage reached since the power-on of this attempt."""
        if self.token_at is not None and self.token_at >= self.requested_at:
            return Stage.TOKEN_ISSUED
        if self.network_boot_at is not None and self.network_boot_at >= self.requested_at:
            return Stage.NETWORK_BOOT
        return Stage.REQUESTED

    @property
    def stage_since(self) -> float:
        """When the current stage was reached (its stall clock starts then)."""
        stage = self.stage
        if stage is Stage.TOKEN_ISSUED and self.token_at is not None:
            return self.token_at
        if stage is Stage.NETWORK_BOOT and self.network_boot_at is not None:
            return self.network_boot_at
        return self.requested_at


@dataclass(frozen=True, slots=True)
class Waiting:
    """The boot is on its way; look again at ``until`` at the latest."""

    stage: Stage
    until: float


@dataclass(frozen=True, slots=True)
class Stalled:
    """The stage did not advance in time: retry (``retry``), or the boot has failed."""

    stage: Stage
    reason: str
    """The condition reason (``NoNetworkBoot``, ``ImageDidNotBoot``, ``JoinDidNotComplete``)."""
    message: str
    retry: bool
    next_attempt: int
    """The attempt a retry would be (``attempt + 1``)."""


Verdict = Waiting | Stalled


def judge(progress: BootProgress, now: float, *, stall_seconds: float, attempts: int) -> Verdict:
    """Whether the boot is waiting or stalled, and whether a stall may be retried.

    ``attempts`` is the most power-ons of one boot (the policy's
    ``provisioning.bootAttempts``); a stall on the last one fails the boot.
    """
    stage = progress.stage
    until = progress.stage_since + stall_seconds
    if now < until:
        return Waiting(stage, until)
    reason, meaning = STALL_REASONS[stage]
    waited = now - progress.stage_since
    retry = progress.attempt < attempts
    tail = (
        f"power cycle {progress.attempt + 1} of {attempts} with a network boot and a new token"
        if retry
        else f"no attempts left ({progress.attempt} of {attempts}): the boot has failed; "
        "power the machine on again once the cause is fixed"
    )
    message = (
        f"stalled at {stage} for {waited:.0f}s (attempt {progress.attempt}): {meaning}; {tail}"
    )
    return Stalled(stage, reason, message, retry, progress.attempt + 1)


# ----------------------------------------------------------- Machine status


def progress_of(status: Mapping[str, Any]) -> BootProgress | None:
    """The boot in progress that a Machine's ``status`` records; None if there is none
    (never powered on through gpufleet, joined, or failed) or it is unreadable."""
    boot = status.get("boot") or {}
    if not isinstance(boot, Mapping) or boot.get("outcome") != "InProgress":
        return None
    if boot.get("requestedBy") == UNREQUESTED:
        return None  # started by an iPXE request (older services): never watched
    requested = parse_rfc3339(boot.get("requestedAt"))
    if requested is None:
        return None
    try:
        attempt = max(1, int(boot.get("attempt") or 1))
    except (TypeError, ValueError):
        attempt = 1
    return BootProgress(
        requested_at=requested,
        attempt=attempt,
        network_boot_at=parse_rfc3339(boot.get("networkBootAt")),
        token_at=parse_rfc3339(status.get("tokenIssuedAt")),
    )


def requested_status(*, by: str, at: float, attempt: int, why: str = "") -> dict[str, Any]:
    """The ``status.boot`` merge patch written *before* a power-on (record before act):
    a crash after it and before the power action costs one stall, never a second action."""
    return {
        "boot": {
            "requestedAt": rfc3339(at),
            "requestedBy": by,
            "attempt": attempt,
            "outcome": "InProgress",
            "stage": str(Stage.REQUESTED),
            "reason": None,
            "message": why or f"powered on by {by} (attempt {attempt})",
        }
    }


UNREQUESTED = "network-boot"
"""``requestedBy`` of a boot that an iPXE request started (provisioning services before
decision 0160 did): :func:`progress_of` does not take it for a boot in progress."""


def network_boot_status(at: float) -> dict[str, Any]:
    """The ``status.boot`` patch the provisioning service writes when it serves the iPXE
    script of a boot in progress (it never starts one: :func:`progress_of` first)."""
    return {"boot": {"networkBootAt": rfc3339(at), "stage": str(Stage.NETWORK_BOOT)}}


def stalled_status(verdict: Stalled) -> dict[str, Any]:
    """The ``status.boot`` patch of a stall that ends the boot (no retry left)."""
    return {
        "phase": "Failed",
        "message": verdict.message[:300],
        "boot": {
            "outcome": "Failed",
            "stage": str(verdict.stage),
            "reason": verdict.reason,
            "message": verdict.message,
        },
    }


def joined_status() -> dict[str, Any]:
    """The ``status.boot`` patch once a Node of the machine is Ready after the power-on."""
    return {"boot": {"outcome": "Joined", "stage": "joined", "reason": None, "message": None}}
