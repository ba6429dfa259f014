"""The parts of a node a fault can belong to: one Node condition per subsystem.

A vocabulary of its own because both the fault catalogue (:mod:`faults`) and
the XID catalogue (:mod:`xids`) name subsystems, and :mod:`faults` looks XIDs
up: kept here, the imports run one way (faults -> xids -> subsystems).
"""

from __future__ import annotations

from enum import StrEnum


class Subsystem(StrEnum):
    """The part of a node a fault belongs to. One Node condition per subsystem."""

    GPU = "gpu"
    NVLINK = "nvlink"
    INFINIBAND = "infiniband"
    PCIE = "pcie"
    KERNEL = "kernel"
    THERMAL = "thermal"
    PERFORMANCE = "performance"
    NVSWITCH = "nvswitch"
    FABRIC = "fabric"
    """NVLink fabric registration (Fabric Manager) and the IMEX domain."""
    SLURM = "slurm"
    """Slurm's own health machinery drained the node for a hardware reason
    (reported by the Slurm syncer, not by the agent)."""


AGENT_SUBSYSTEMS = tuple(s for s in Subsystem if s is not Subsystem.SLURM)
"""The subsystems whose condition the node agent writes (the syncer writes ``slurm``'s)."""
