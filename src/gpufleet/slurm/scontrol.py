"""Writes to Slurm through ``scontrol``, where slurmrestd 22.05 has no endpoint.

Which writes and why (slurmrestd v0.0.36-v0.0.38, Slurm 22.05.8):

============================  ==================================================
node drain / undrain          no node update endpoint in v0.0.38 -> scontrol
job requeue                   ``POST /job/{id}`` cannot requeue -> scontrol
reconfigure                   no endpoint -> scontrol
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.slurm import hostlist
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmUnavailable


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
        argv = [self.config.scontrol, *args]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, **self.config.env},
            )
        except OSError as e:
            raise SlurmUnavailable(f"cannot run {argv[0]}: {e}") from e
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.config.timeout_s)
        except TimeoutError as e:
            proc.kill()
            await proc.wait()
            raise SlurmUnavailable(f"{' '.join(argv)} timed out") from e
        if proc.returncode != 0:
            text = err.decode(errors="replace")
            if "Unable to contact slurm controller" in text or "Socket timed out" in text:
                raise SlurmUnavailable(text.strip())
            raise SlurmCommandFailed(argv, proc.returncode or 1, text)
        return out.decode(errors="replace")

    async def drain(self, node: str | Sequence[str], reason: str) -> None:
        """Drain one node, or several (one hostlist, one call) with the same reason."""
        await self.run("update", f"nodename={_names(node)}", "state=DRAIN", f"reason={reason}")

    async def undrain(self, node: str | Sequence[str]) -> None:
        await self.run("update", f"nodename={_names(node)}", "state=UNDRAIN")

    async def requeue(self, job_ids: Sequence[int]) -> None:
        if job_ids:
            await self.run("requeue", ",".join(str(j) for j in job_ids))

    async def reconfigure(self) -> None:
        await self.run("reconfigure")


def _names(node: str | Sequence[str]) -> str:
    if isinstance(node, str):
        return node
    if not node:
        raise ValueError("no node names")
    return hostlist.compress(node)
