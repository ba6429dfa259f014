"""Remediation steps, from the least to the most disruptive.

The ladder itself (which steps, their timeouts, attempts and escalation) is
policy data (:class:`gpufleet.domain.policy.LadderStep`); this module only
names the steps and what kind of thing each one is.
"""

from __future__ import annotations

from enum import StrEnum


class Step(StrEnum):
    """A rung of the remediation ladder, or a terminal hand-off to people."""

    RESTART_JOB = "restart-job"
    """Requeue the job; the node stays in production (application-level faults)."""
    GPU_RESET = "gpu-reset"
    """``nvidia-smi -r`` on the affected GPU, asked of the node's agent."""
    REBOOT = "reboot"
    """Graceful restart through the BMC; for a stateless node this reimages it."""
    POWER_CYCLE = "power-cycle"
    """Power off and on through the BMC: clears what a warm reboot keeps."""
    REIMAGE = "reimage"
    """One-time network boot override, then power cycle."""
    TRIAGE = "triage"
    """Stop automation; a person looks at the node."""
    RMA = "rma"
    """Send the hardware back to the vendor."""


SEVERITY: tuple[Step, ...] = tuple(Step)
"""All steps, least disruptive first."""

NODE_ACTIONS: frozenset[Step] = frozenset(
    {Step.GPU_RESET, Step.REBOOT, Step.POWER_CYCLE, Step.REIMAGE}
)
"""Steps that act on the node (and so need it drained first)."""

DISRUPTIVE: frozenset[Step] = frozenset({Step.REBOOT, Step.POWER_CYCLE, Step.REIMAGE})
"""Steps that restart the whole machine; these go through the rate limit and
the circuit breaker, and are never repeated after a controller restart."""

TERMINAL: frozenset[Step] = frozenset({Step.TRIAGE, Step.RMA})
"""Hand-offs to people: automation stops here."""


def severity(step: Step) -> int:
    """Position of a step on the ladder (0 = least disruptive)."""
    return SEVERITY.index(step)
