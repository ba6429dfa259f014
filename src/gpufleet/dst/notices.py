"""Departure notices in the simulation: jobs that ask for one, invariants 17 and 18.

A Slurm job of the scenario may ask for a departure notice (``gpufleet.io/notice``,
:mod:`gpufleet.domain.departure`); given one (``scancel --signal=USR1``, the syncer's
:mod:`gpufleet.slurm.departures`), it leaves after its ``depart_s`` (its steps end and
the batch script with them, exit code 75), finishes its work then (exit 0), or ignores
it; any noticed job may also reach the end of its work (exit 0) within the grace. The
syncer requeues it once it departed, or when the grace ends; a syncer killed in between
finds its record on the Node.

17. **a noticed job that left is requeued**: every job that ended by itself within the
    grace of its first notice is brought back by a ``scontrol requeue`` by the end of the
    run (unless it left in the last :data:`SETTLE_S` seconds). A lost requeue is a
    training that stopped because gpufleet asked it to.
18. **a noticed job that ended on its own is not requeued**: no job that was signalled and
    then ended by itself other than by departing (exit 0: its work done) is brought back
    by a ``scontrol requeue`` (docs/decisions/0279). A violation is finished work run
    again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpufleet.domain import departure
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
            code = job.depart_code
            if model.jobs.get(job.id) is job and model.end_job(job.id, exit_code=code):
                how = "left" if code == departure.DEPARTED_EXIT_CODE else "finished its work"
                world.trace.add(
                    "slurmctld", f"job {job.id}", f"{how} after its notice (exit {code})", key=True
                )

        world.loop.call_later(job.depart_s, depart)

    model.on_signal.append(noticed)


def check_end(world: World, fail: Callable[[str, str, str], None]) -> None:
    """17: every job that left within the grace of its notice was requeued; 18: none
    that ended on its own otherwise was."""
    model = world.slurm
    for job_id in sorted(model.rerun):
        after = model.done_noticed[job_id] - model.signalled[job_id]
        fail(
            "18",
            "-",
            f"job {job_id} ended on its own {after:.1f} s after its departure notice (exit 0, "
            "its work done) and was requeued: run again",
        )
        return
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
