"""Departure notices in the simulation: jobs that ask for one, and invariant 17.

A Slurm job of the scenario may ask for a departure notice (``gpufleet.io/notice``,
:mod:`gpufleet.domain.departure`); given one (``scancel --signal=USR1``, the syncer's
:mod:`gpufleet.slurm.departures`), it leaves after its ``depart_s`` (its steps end and
the batch script with them: the job finishes) or ignores it. The syncer then requeues
it once it left, or when the grace ends; a syncer killed in between finds its record on
the Node.

17. **a noticed job that left is requeued**: every job that ended by itself within the
    grace of its first notice is brought back by a ``scontrol requeue`` by the end of the
    run (unless it left in the last :data:`SETTLE_S` seconds). A lost requeue is a
    training that stopped because gpufleet asked it to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpufleet.dst.procs import SYNC_SETTINGS

if TYPE_CHECKING:
    from gpufleet.dst.slurm import Job
    from gpufleet.dst.world import World

SETTLE_S = 150.0
"""A job that left this close to the end may still be waiting for a syncer or a
slurmctld that an environment event took away (each comes back within 125 s)."""


def install(world: World) -> None:
    """Noticed jobs leave after their ``depart_s`` (the same job, if still running)."""
    model = world.slurm

    def noticed(job: Job) -> None:
        if job.depart_s is None:
            world.trace.add("slurmctld", f"job {job.id}", "ignores its notice", key=True)
            return

        def depart() -> None:
            if model.jobs.get(job.id) is job and model.end_job(job.id) is not None:
                world.trace.add("slurmctld", f"job {job.id}", "left after its notice", key=True)

        world.loop.call_later(job.depart_s, depart)

    model.on_signal.append(noticed)


def check_end(world: World, fail: Callable[[str, str, str], None]) -> None:
    """17: every job that left within the grace of its notice was requeued."""
    model = world.slurm
    grace = SYNC_SETTINGS.notice_grace_s
    end = world.clock.now()
    for job_id, (job, left_at) in sorted(model.finished.items()):
        noticed_at = model.signalled[job_id]
        if left_at - noticed_at > grace or end - left_at < SETTLE_S:
            continue
        fail(
            "17",
            job.node,
            f"job {job_id} left {left_at - noticed_at:.1f} s after its departure notice and "
            f"was never requeued ({end - left_at:.0f} s before the end)",
        )
        return
