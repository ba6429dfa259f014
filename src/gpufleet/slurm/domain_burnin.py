"""Run an NVLink domain's burn-in as one Slurm job across its trays (docs/decisions/0246).

The trays are out of production (burn-in, verifying, held), so the syncer keeps them
drained (``gpufleet: state burn-in``) and Slurm would start no job on them, this one
included. The run therefore:

1. refuses if any tray runs a job (``squeue -w``) or is drained by someone else;
2. creates a maintenance reservation ``gpufleet-burnin-<domain>`` on exactly the trays
   for root (without ``IGNORE_JOBS``: Slurm itself refuses it on a node with a job, so
   a job that arrived after step 1 stops the run too);
3. lifts gpufleet's own drains on the trays: inside the reservation only its job can
   start there;
4. runs ``srun --reservation ... -w TRAYS python -m gpufleet.health.domain_allreduce``
   (``--immediate``: if the allocation is not granted at once, no run), bounded in time;
5. whatever happened, drains the trays again with the reasons they had and deletes the
   reservation.

The output (nccl-tests' format) goes back to the caller, which judges it
(:func:`gpufleet.domain.domain_burnin.judge`). The srun's output comes back to the
submitter over Slurm's own I/O forwarding: no shared file system is needed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.domain import hostlist, well_known
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmError
from gpufleet.slurm.scontrol import Scontrol
from gpufleet.waits import within

RESERVATION_PREFIX = "gpufleet-burnin-"


class Refused(SlurmError):
    """The burn-in would touch a tray that is not free for it; nothing was changed."""


@dataclass(frozen=True, slots=True)
class Job:
    """One domain burn-in to run."""

    domain: str
    trays: tuple[str, ...]
    program: Mapping[str, Any]
    """The all-reduce program's arguments (gpufleet.health.domain_allreduce)."""
    python: str
    """The Python on the trays that has gpufleet and torch (the agent image's)."""
    ranks_per_node: int = 1
    timeout_s: float = 300.0
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for srun and squeue (``SLURM_CONF``)."""
    srun: str = "srun"
    squeue: str = "squeue"

    @property
    def reservation(self) -> str:
        return RESERVATION_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "-", self.domain)


@dataclass(frozen=True, slots=True)
class Ran:
    """What the srun gave back."""

    output: str
    exit_code: int
    stderr: str
    seconds: float


async def _exec(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> Ran:
    loop = asyncio.get_running_loop()
    started = loop.time()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    try:
        out, err = await within(timeout_s, proc.communicate())
    except TimeoutError:
        proc.terminate()  # srun cancels its job step on SIGTERM
        try:
            out, err = await within(10, proc.communicate())
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
        text = err.decode(errors="replace") + f"\nno result within {timeout_s:g}s"
        return Ran(out.decode(errors="replace"), -1, text, loop.time() - started)
    return Ran(
        out.decode(errors="replace"),
        proc.returncode or 0,
        err.decode(errors="replace"),
        loop.time() - started,
    )


async def jobs_on(job: Job) -> list[str]:
    """``JOBID@NODELIST`` of every job on the trays (any state but finished)."""
    names = hostlist.compress(sorted(job.trays))
    ran = await _exec([job.squeue, "-h", "-w", names, "-o", "%i@%N"], job.env, 30)
    if ran.exit_code != 0:
        raise SlurmError(f"squeue -w {names}: {ran.stderr.strip()}")
    return ran.output.split()


async def drains(scontrol: Scontrol, trays: Sequence[str]) -> dict[str, str | None]:
    """Each tray's drain reason (None: not drained)."""
    text = await scontrol.run("-o", "show", "node", hostlist.compress(sorted(trays)))
    found: dict[str, str | None] = {}
    for line in text.splitlines():
        name = re.search(r"NodeName=(\S+)", line)
        state = re.search(r"State=(\S+)", line)
        if not name or not state:
            continue
        # Slurm ends a drain's reason with "[user@time]"; without one, at the next Key=.
        reason = re.search(r"Reason=(.*?) \[[^\]@]*@[^\]]*\]", line) or re.search(
            r"Reason=(.*?)(?: [A-Za-z]+=|$)", line
        )
        drained = "DRAIN" in state.group(1)
        found[name.group(1)] = (reason.group(1).strip() if reason else "") if drained else None
    return found


def argv(job: Job) -> list[str]:
    """The srun command line."""
    minutes = max(1, int(job.timeout_s // 60) + 1)
    return [
        job.srun,
        f"--reservation={job.reservation}",
        f"--job-name=gpufleet-domain-burnin-{job.domain}"[:120],
        f"--nodes={len(job.trays)}",
        f"--nodelist={hostlist.compress(sorted(job.trays))}",
        f"--ntasks-per-node={job.ranks_per_node}",
        "--exclusive",
        "--immediate=30",
        f"--time={minutes}",
        "--kill-on-bad-exit=1",
        job.python,
        "-m",
        "gpufleet.health.domain_allreduce",
        json.dumps(dict(job.program), separators=(",", ":")),
    ]


async def run(job: Job, scontrol: Scontrol) -> Ran:
    """The burn-in's srun on the trays, inside a reservation (see the module docstring).

    Raises :class:`Refused` (nothing changed) when a tray runs a job or is held by a drain
    that is not gpufleet's."""
    busy = await jobs_on(job)
    if busy:
        raise Refused(f"not started: job(s) on the trays: {', '.join(busy)}")
    before = await drains(scontrol, job.trays)
    missing = sorted(set(job.trays) - set(before))
    if missing:
        raise Refused(f"not started: Slurm does not know {', '.join(missing)}")
    foreign = {
        n: r for n, r in before.items() if r is not None and not well_known.is_owned_slurm_reason(r)
    }
    if foreign:
        held = ", ".join(f"{n} ({r})" for n, r in sorted(foreign.items()))
        raise Refused(f"not started: drained by someone else: {held}")
    minutes = max(1, int(job.timeout_s // 60) + 2)
    try:
        await scontrol.run(
            "create",
            "reservation",
            f"ReservationName={job.reservation}",
            "StartTime=now",
            f"Duration={minutes}",
            f"Nodes={hostlist.compress(sorted(job.trays))}",
            "Users=root",
            "Flags=MAINT",
        )
    except SlurmCommandFailed as exc:
        raise Refused(f"not started: Slurm refused the reservation: {exc.stderr}") from exc
    ours = {n: r for n, r in before.items() if r is not None}
    try:
        if ours:
            await scontrol.undrain(sorted(ours))
        return await _exec(argv(job), job.env, job.timeout_s + 60)
    finally:
        for reason in sorted(set(ours.values())):
            nodes = sorted(n for n, r in ours.items() if r == reason)
            await scontrol.drain(nodes, reason or well_known.slurm_reason("domain burn-in"))
        await scontrol.delete_reservation(job.reservation)
