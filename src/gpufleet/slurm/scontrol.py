"""Writes to Slurm through ``scontrol``, where slurmrestd 22.05 has no endpoint.

Which writes and why (slurmrestd v0.0.36-v0.0.38, Slurm 22.05.8):

============================  ==================================================
node drain / undrain          no node update endpoint in v0.0.38 -> scontrol
job requeue                   ``POST /job/{id}`` cannot requeue -> scontrol
departure notice (USR1)       ``scancel --signal``, steps only (docs/decisions/0272)
reconfigure                   no endpoint -> scontrol
reservations                  no create or update endpoint up to v0.0.42 -> scontrol
============================  ==================================================

``scontrol`` authenticates with munge, or with a JWT when ``SLURM_JWT`` is
set (``AuthAltTypes=auth/jwt`` in slurm.conf), so the syncer's pod needs only
slurm.conf and the JWT key, not the munge key.

We resume with ``state=UNDRAIN``, not ``RESUME``: it clears only the DRAIN
flag and leaves a DOWN base state (Slurm's, or an admin's) as it is.

Several nodes with the same reason are drained with one call
(``nodename=gpu-node-[0001-0003,0042]``): a burst of faults costs one
scontrol process and one slurmctld RPC per reason, not one per node. At most
``max_in_flight`` scontrol processes run at once.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.domain import hostlist
from gpufleet.domain.maintenance import Reservation
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmUnavailable
from gpufleet.waits import within


@dataclass(frozen=True, slots=True)
class ScontrolConfig:
    scontrol: str = "scontrol"
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment: ``SLURM_CONF`` and, optionally, ``SLURM_JWT``."""
    timeout_s: float = 10.0
    max_in_flight: int = 4
    """scontrol processes at once (each is an RPC slurmctld serves with its own threads)."""


class Scontrol:
    def __init__(self, config: ScontrolConfig) -> None:
        self.config = config
        self._slots = asyncio.Semaphore(config.max_in_flight)

    async def run(self, *args: str) -> str:
        async with self._slots:
            return await self._run(*args)

    async def _run(self, *args: str) -> str:
        return await run_tool([self.config.scontrol, *args], self.config.env, self.config.timeout_s)

    async def drain(self, node: str | Sequence[str], reason: str) -> None:
        """Drain one node, or several (one hostlist, one call) with the same reason."""
        await self.run("update", f"nodename={_names(node)}", "state=DRAIN", f"reason={reason}")

    async def undrain(self, node: str | Sequence[str]) -> None:
        await self.run("update", f"nodename={_names(node)}", "state=UNDRAIN")

    async def requeue(self, job_ids: Sequence[int]) -> None:
        if job_ids:
            await self.run("requeue", ",".join(str(j) for j in job_ids))

    async def signal_steps(self, job_id: int, signal: str) -> None:
        """``scancel --signal=<signal> <job>``: without ``--batch`` or ``--full`` Slurm
        signals the job's steps only, so the batch shell lives on to see them exit."""
        scancel = os.path.join(os.path.dirname(self.config.scontrol), "scancel")
        async with self._slots:
            await run_tool(
                [scancel, f"--signal={signal}", str(job_id)], self.config.env, self.config.timeout_s
            )

    async def reconfigure(self) -> None:
        await self.run("reconfigure")

    # -- reservations ---------------------------------------------------------

    async def reservations(self) -> list[Reservation]:
        return parse_reservations(await self.run("-o", "show", "reservation"))

    async def create_reservation(self, reservation: Reservation) -> None:
        r = reservation
        await self.run(
            "create",
            "reservation",
            f"ReservationName={r.name}",
            f"StartTime={slurm_time(r.start)}",
            "Duration=UNLIMITED",
            f"Nodes={_names(sorted(r.nodes))}",
            "Users=root",
            "Flags=MAINT,IGNORE_JOBS",
        )

    async def update_reservation(self, reservation: Reservation, *, move_start: bool) -> None:
        r = reservation
        start = [f"StartTime={slurm_time(r.start)}"] if move_start else []
        await self.run(
            "update", f"ReservationName={r.name}", f"Nodes={_names(sorted(r.nodes))}", *start
        )

    async def delete_reservation(self, name: str) -> None:
        await self.run("delete", f"ReservationName={name}")

    async def put_tenant_reservation(self, reservation: Reservation, *, create: bool) -> None:
        """A tenant's reservation (docs/decisions/0291): its account only, from now, no end.
        ``IGNORE_JOBS``: created or grown over nodes where others' jobs run, which run on
        (a reservation never stops a job); others' new jobs stay off its nodes."""
        r = reservation
        nodes = f"Nodes={_names(sorted(r.nodes))}"
        accounts = f"Accounts={','.join(sorted(r.accounts))}"
        if create:
            await self.run(
                "create", "reservation", f"ReservationName={r.name}", "StartTime=now",
                "Duration=UNLIMITED", nodes, accounts, "Flags=IGNORE_JOBS",
            )  # fmt: skip
        else:
            await self.run("update", f"ReservationName={r.name}", nodes, accounts)

    async def node_names(self) -> frozenset[str]:
        """Every node slurmctld knows (``sinfo -h -N -o %N``: one name a line)."""
        sinfo = os.path.join(os.path.dirname(self.config.scontrol), "sinfo")
        async with self._slots:
            out = await run_tool(
                [sinfo, "-h", "-N", "-o", "%N"], self.config.env, self.config.timeout_s
            )
        return frozenset(line.strip() for line in out.splitlines() if line.strip())


async def run_tool(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> str:
    """Run one of Slurm's command-line tools (scontrol, sbatch, squeue, scancel): its standard
    output. :class:`SlurmUnavailable` when it cannot run, times out or cannot reach
    slurmctld; :class:`SlurmCommandFailed` when it refuses."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **env},
        )
    except OSError as e:
        raise SlurmUnavailable(f"cannot run {argv[0]}: {e}") from e
    try:
        out, err = await within(timeout_s, proc.communicate())
    except TimeoutError as e:
        proc.kill()
        await proc.wait()
        raise SlurmUnavailable(f"{' '.join(argv)} timed out") from e
    if proc.returncode != 0:
        text = err.decode(errors="replace")
        if "Unable to contact slurm controller" in text or "Socket timed out" in text:
            raise SlurmUnavailable(text.strip())
        raise SlurmCommandFailed(list(argv), proc.returncode or 1, text)
    return out.decode(errors="replace")


def slurm_time(at: float) -> str:
    """A Slurm time: ``now`` for a time that has come, else local ``YYYY-MM-DDTHH:MM:SS``
    (slurmctld reads times in its own zone; the syncer runs beside it)."""
    if at <= time.time() + 1:
        return "now"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at))


def parse_reservations(text: str) -> list[Reservation]:
    """``scontrol -o show reservation``: one ``Key=Value ...`` line per reservation
    ("No reservations in the system" when there are none)."""
    found = []
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        name = fields.get("ReservationName")
        if not name:
            continue
        try:
            start = time.mktime(time.strptime(fields.get("StartTime", ""), "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            start = 0.0
        nodes = fields.get("Nodes", "")
        names = frozenset(hostlist.expand(nodes)) if nodes and nodes != "(null)" else frozenset()
        accounts = fields.get("Accounts", "")
        admitted = frozenset(a for a in accounts.split(",") if a and a != "(null)")
        found.append(Reservation(name=name, start=start, nodes=names, accounts=admitted))
    return found


def _names(node: str | Sequence[str]) -> str:
    if isinstance(node, str):
        return node
    if not node:
        raise ValueError("no node names")
    return hostlist.compress(node)
