"""Choices a person names on the command line and in specs, apart from the models.

A MaintenancePlan's action and its command's default timeout live here, so that a
command's help that offers them (``gpufleet maintenance create --help``) does not build
the policy's and the plans' pydantic models (docs/cli.md, start-up). The modules that
use them re-export them: :mod:`gpufleet.domain.maintenance` names them as before.
"""

from __future__ import annotations

from enum import StrEnum


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


DEFAULT_COMMAND_TIMEOUT_S = 3600.0
"""How long a plan's command may run on a node unless the plan says otherwise."""
