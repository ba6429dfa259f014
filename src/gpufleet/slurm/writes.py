"""Writes to Slurm: through slurmrestd where the negotiated API has them, else scontrol.

slurmrestd v0.0.40 and later (Slurm 23.02+, 24.11 serves v0.0.40-v0.0.42) update
nodes and reconfigure; v0.0.36-v0.0.38 (Slurm 22.05) do neither. No version
requeues a job. :class:`SlurmWrites` is the :class:`~gpufleet.slurm.ports.ScontrolPort`
the syncer and the operator are given: it asks the REST client, once its version
is negotiated, and falls back to ``scontrol`` for what the API lacks, so the
decisions above it are the same code for every Slurm.

Why the API where it can: a syncer or operator pod then needs no Slurm client
of the server's exact release (scontrol speaks only its own release's RPCs
and two older ones), no munge key and no slurm.conf for its writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.slurm.ports import ScontrolPort
from gpufleet.slurm.restapi import SlurmRest


class SlurmWrites:
    """Drain, undrain and reconfigure by REST when it can; requeue by scontrol. (Maintenance
    reservations have no API either: the syncer is given the scontrol client for them.)"""

    def __init__(self, rest: SlurmRest, scontrol: ScontrolPort) -> None:
        self.rest = rest
        self.scontrol = scontrol

    @property
    def by_rest(self) -> bool:
        """Whether node writes go through slurmrestd now (its version has node update)."""
        return self.rest.updates_nodes

    async def drain(self, node: str | Sequence[str], reason: str) -> None:
        if self.by_rest:
            await self.rest.drain(node, reason)
        else:
            await self.scontrol.drain(node, reason)

    async def undrain(self, node: str | Sequence[str]) -> None:
        if self.by_rest:
            await self.rest.undrain(node)
        else:
            await self.scontrol.undrain(node)

    async def requeue(self, job_ids: Sequence[int]) -> None:
        await self.scontrol.requeue(job_ids)

    async def signal_steps(self, job_id: int, signal: str) -> None:
        await self.scontrol.signal_steps(job_id, signal)

    async def reconfigure(self) -> None:
        if self.by_rest:
            await self.rest.reconfigure()
        else:
            await self.scontrol.reconfigure()
