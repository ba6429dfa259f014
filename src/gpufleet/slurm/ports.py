"""What the syncer and the SlurmCluster operator use of Slurm, as two Protocols.

:class:`SlurmRestPort` is the read side (slurmrestd, :class:`gpufleet.slurm.restapi.SlurmRest`),
:class:`ScontrolPort` the write side (``scontrol``, :class:`gpufleet.slurm.scontrol.Scontrol`):
Slurm 22.05's REST API has no node update or requeue, so the two are separate clients.
Code that drives Slurm takes these, not the concrete clients, so the unit tests' fake
(``tests/unit/fakes.py``) is checked by mypy against the same interface the real clients
are: a method the syncer starts calling shows up as a type error in the fake, not as an
``AttributeError`` in one test.

Errors are part of the contract: every method raises
:class:`~gpufleet.slurm.errors.SlurmUnavailable` when Slurm does not answer (the view is
then unknown: fail closed), and a write raises
:class:`~gpufleet.slurm.errors.SlurmCommandFailed` when Slurm refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from gpufleet.domain import departure, slurm_sync
from gpufleet.domain.maintenance import Reservation


class SlurmRestPort(Protocol):
    """The Slurm view: nodes and running jobs, read from slurmrestd."""

    @property
    def version(self) -> str | None:
        """The negotiated API version; None until :meth:`connect` succeeded."""
        ...

    async def connect(self) -> str:
        """Negotiate the API version; returns it."""
        ...

    async def nodes(self) -> dict[str, slurm_sync.SlurmView]:
        """Every node's view, by name."""
        ...

    async def nodes_if_changed(self, since: float) -> dict[str, slurm_sync.SlurmView] | None:
        """Every node's view if a node changed after ``since`` (epoch seconds); None when
        Slurm says nothing did."""
        ...

    async def node(self, name: str) -> slurm_sync.SlurmView | None:
        """One node, read fresh (before a write); None when Slurm does not know it."""
        ...

    async def running_jobs(self) -> list[slurm_sync.JobView]:
        """The jobs that hold nodes now."""
        ...

    async def running_jobs_if_changed(self, since: float) -> list[slurm_sync.JobView] | None:
        """The jobs that hold nodes now if a job changed after ``since``; else None."""
        ...

    ended_jobs: Mapping[int, departure.Ended]
    """The jobs that asked for a departure notice and hold no node any more, as the last
    jobs read saw them (how each ended decides whether it is requeued)."""


class ScontrolPort(Protocol):
    """Writes to Slurm: drain, undrain, requeue, reconfigure."""

    async def drain(self, node: str | Sequence[str], reason: str) -> None:
        """Drain one node, or several with the same reason in one call."""
        ...

    async def undrain(self, node: str | Sequence[str]) -> None:
        """Clear the DRAIN flag only (a DOWN base state stays)."""
        ...

    async def requeue(self, job_ids: Sequence[int]) -> None: ...

    async def signal_steps(self, job_id: int, signal: str) -> None:
        """Send ``signal`` (``USR1``) to the job's steps, not its batch shell
        (``scancel --signal``: the departure notice, docs/decisions/0272)."""
        ...

    async def reconfigure(self) -> None:
        """Make slurmctld and every slurmd reread the configuration."""
        ...


class ReservationPort(Protocol):
    """Slurm reservations (``scontrol``: no slurmrestd version up to v0.0.42 creates one).

    The syncer's maintenance reservations (:mod:`gpufleet.slurm.reservations`) use it.
    """

    async def reservations(self) -> list[Reservation]:
        """Every reservation Slurm has (the caller keeps only its own)."""
        ...

    async def create_reservation(self, reservation: Reservation) -> None:
        """A maintenance reservation (MAINT, IGNORE_JOBS, for root only, no end)."""
        ...

    async def update_reservation(self, reservation: Reservation, *, move_start: bool) -> None:
        """Set its nodes (and its start, with ``move_start``: ``now`` once it has come)."""
        ...

    async def delete_reservation(self, name: str) -> None: ...
