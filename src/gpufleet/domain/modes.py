"""Choices a person names on the command line and in specs, apart from the models.

How a node is emptied (the policy's drain and requeue modes) and what a MaintenancePlan
does to it live here, so that a command's help that offers them (``gpufleet maintenance
create --help``) does not build the policy's and the plans' pydantic models (docs/cli.md,
start-up). The modules that use them re-export them: :mod:`gpufleet.domain.policy` and
:mod:`gpufleet.domain.maintenance` name them as before.
"""

from __future__ import annotations

from enum import StrEnum


class DrainMode(StrEnum):
    """How workloads leave a node that is taken out."""

    WAIT = "wait"
    """Wait for workloads to finish; only interruptible pods are evicted."""
    EVICT = "evict"
    """Evict now through the Eviction API (PodDisruptionBudgets respected)."""
    DELETE_AFTER_TIMEOUT = "delete-after-timeout"
    """Evict now; delete what is still there after the drain timeout."""


class RequeueMode(StrEnum):
    """What happens to Slurm jobs on a node drained for a fault."""

    NOW = "now"
    """Requeue at once; they resume from their last checkpoint elsewhere."""
    LET_FINISH = "let-finish"
    """Drain in Slurm but let running jobs finish."""


class Action(StrEnum):
    """What a plan does to each node once it is drained."""

    REIMAGE = "reimage"
    """One-time network boot through the BMC to the plan's image version."""
    REBOOT = "reboot"
    """Restart through the BMC (a stateless node boots its image again)."""
    NOOP = "noop"
    """Drain, hold in ``maintenance``, verify, return: for work done by hand or by
    tools outside gpufleet while the node is out."""
    COMMAND = "command"
    """Drain, then the node's agent runs one of the maintenance commands installed on
    the node (by name: a firmware flash, a driver update), then verify and return."""


class Scope(StrEnum):
    """What one unit of a MaintenancePlan is (``spec.scope``)."""

    NODE = "node"
    """Nodes, batch by batch (``maxUnavailable``, ``maxPerDomain``)."""
    NVLINK_DOMAIN = "nvlinkDomain"
    """Whole NVLink domains: every tray of a domain drained together, acted on only once
    all are empty, returned together (switch firmware, NVSwitch tray service:
    docs/decisions/0244)."""


DEFAULT_COMMAND_TIMEOUT_S = 3600.0
"""How long a plan's command may run on a node unless the plan says otherwise."""
