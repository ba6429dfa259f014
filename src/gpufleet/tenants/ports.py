"""What the tenant controller is handed: its ports (the loop knows no Slurm command).

The Slurm side is implemented by ``gpufleet.slurm.associations``; the loop reads
and applies through this Protocol only, so the simulation and the tests can hand
it another implementation with the same behaviour.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpufleet.domain.maintenance import Reservation
from gpufleet.domain.tenancy import AssociationOp, SlurmTenancy


class SlurmAssociations(Protocol):
    """Slurm's accounts, their users, QOS and GPU limits, and each account's running GPUs."""

    async def read(self) -> SlurmTenancy:
        """Every account (gpufleet's and others) and the GPUs its running jobs hold."""
        ...

    async def apply(self, ops: Sequence[AssociationOp]) -> None:
        """Apply ``ops`` in order; raises when Slurm refused one (the loop retries next poll)."""
        ...


class TenantReservations(Protocol):
    """Slurm reservations of tenants' own nodes (``gpufleet.slurm.scontrol.Scontrol``)."""

    async def reservations(self) -> list[Reservation]:
        """Every reservation Slurm has (the caller keeps only ``gpufleet-tenant-*``)."""
        ...

    async def node_names(self) -> frozenset[str]:
        """Every node slurmctld knows."""
        ...

    async def put_tenant_reservation(self, reservation: Reservation, *, create: bool) -> None:
        """Create it (from now, no end, its accounts only) or set its nodes and accounts."""
        ...

    async def delete_reservation(self, name: str) -> None: ...
