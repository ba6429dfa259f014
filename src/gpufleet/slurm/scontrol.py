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
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.slurm.errors import SlurmCommandFailed, SlurmUnavailable


@dataclass(frozen=True, slots=True)
class ScontrolConfig:
    scontrol: str = "scontrol"
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment: ``SLURM_CONF`` and, optionally, ``SLURM_JWT``."""
    timeout_s: float = 10.0


class Scontrol:
    def __init__(self, config: ScontrolConfig) -> None:
        self.config = config

    async def run(self, *args: str) -> str:
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

    async def drain(self, node: str, reason: str) -> None:
        await self.run("update", f"nodename={node}", "state=DRAIN", f"reason={reason}")

    async def undrain(self, node: str) -> None:
        await self.run("update", f"nodename={node}", "state=UNDRAIN")

    async def requeue(self, job_ids: Sequence[int]) -> None:
        if job_ids:
            await self.run("requeue", ",".join(str(j) for j in job_ids))

    async def reconfigure(self) -> None:
        await self.run("reconfigure")
