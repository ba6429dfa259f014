"""Quarantined GPUs kept out of Slurm's scheduling: one holder job of gpufleet's per GPU.

Every ``interval_s`` the syncer compares, node by node, the GPUs the records on the Nodes
quarantine (:func:`gpufleet.domain.gpu_holds.wanted`: only on a node in production) with
its holder jobs in Slurm, cancels the holders no longer wanted, and acquires the missing
GPUs one node at a time (:mod:`gpufleet.domain.gpu_holds` says how and why this way:
Slurm cannot take one GPU out of a node any other way while jobs run on the rest).

The holders are gpufleet's alone (job name ``gpufleet-gpu-hold``, comment ``gpufleet:
...``); a pass that cannot read them changes nothing; dry-run logs and submits nothing.
Slurm is reached with its command-line tools (sbatch, squeue, scontrol, scancel: no
slurmrestd version up to v0.0.42 shows a job's GPU indexes), beside the syncer's scontrol.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.api import nodedata
from gpufleet.clock import SYSTEM_CLOCK, Clock
from gpufleet.domain import gpu_holds as gh
from gpufleet.slurm.errors import SlurmError
from gpufleet.slurm.scontrol import run_tool

log = logging.getLogger("gpufleet.slurm.gpu_holds")


class GpuHoldPort(Protocol):
    """What the holders need of Slurm."""

    async def holders(self) -> list[gh.HoldJob]:
        """Every job named ``gpufleet-gpu-hold`` (with its GPU indexes when running)."""
        ...

    async def submit(self, node: str, comment: str) -> int:
        """Submit one holder pinned to ``node`` with one GPU; its job id."""
        ...

    async def allocation(self, job_id: int) -> tuple[int, ...] | None:
        """The GPU indexes of a running job; None while it is not running."""
        ...

    async def cancel(self, job_ids: Sequence[int]) -> None: ...


@dataclass(frozen=True, slots=True)
class CliConfig:
    bin_dir: str = ""
    """Where sbatch, squeue, scontrol and scancel are ("" : on PATH)."""
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0


class SlurmCli:
    """:class:`GpuHoldPort` through Slurm's command-line tools."""

    def __init__(self, config: CliConfig) -> None:
        self.config = config

    async def _run(self, tool: str, *args: str) -> str:
        path = os.path.join(self.config.bin_dir, tool) if self.config.bin_dir else tool
        return await run_tool([path, *args], self.config.env, self.config.timeout_s)

    async def holders(self) -> list[gh.HoldJob]:
        text = await self._run("squeue", "-h", "-n", gh.HOLD_NAME, "-o", "%i|%T|%N|%n|%k")
        jobs: list[gh.HoldJob] = []
        for line in text.splitlines():
            parts = line.split("|", 4)
            if len(parts) != 5 or not parts[0].isdigit():
                continue
            job_id, state, ran_on, asked, comment = parts
            running = state == "RUNNING"
            gpus = (await self.allocation(int(job_id)) or ()) if running else ()
            jobs.append(gh.HoldJob(int(job_id), ran_on or asked, running, gpus, comment))
        return jobs

    async def submit(self, node: str, comment: str) -> int:
        out = await self._run(
            "sbatch",
            "--parsable",
            f"--job-name={gh.HOLD_NAME}",
            f"--nodelist={node}",
            "--gres=gpu:1",
            "--ntasks=1",
            "--cpus-per-task=1",
            "--mem=1",
            "--no-requeue",
            f"--comment={comment}",
            "--output=/dev/null",
            "--wrap=exec sleep infinity",
        )
        return int(out.strip().split(";", 1)[0])

    async def allocation(self, job_id: int) -> tuple[int, ...] | None:
        text = await self._run("scontrol", "-d", "-o", "show", "job", str(job_id))
        if "JobState=RUNNING" not in text:
            return None
        return gh.gpu_indexes(text)

    async def cancel(self, job_ids: Sequence[int]) -> None:
        if job_ids:
            await self._run("scancel", *(str(j) for j in job_ids))


class GpuHolds:
    """One pass with :meth:`reconcile`; :meth:`loop` runs it every ``interval_s``."""

    def __init__(
        self,
        slurm: GpuHoldPort,
        *,
        nodes: Callable[[], Mapping[str, Mapping[str, Any]]],
        slurm_known: Callable[[str], bool],
        interval_s: float = 5.0,
        start_wait_s: float = 5.0,
        dry_run: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.slurm = slurm
        self.nodes = nodes
        """The managed Nodes' bodies by name (the syncer's watch)."""
        self.slurm_known = slurm_known
        self.interval_s = interval_s
        self.start_wait_s = start_wait_s
        self.dry_run = dry_run
        self.clock = clock
        self.any_held = True
        """Whether the last pass saw a holder (first pass: assume so, to read them)."""

    async def reconcile(self) -> dict[str, gh.HoldPlan]:
        """Hold every wanted GPU, cancel every other holder of ours; the plans carried out."""
        want: dict[str, frozenset[int]] = {}
        faults: dict[str, dict[int, str]] = {}
        for name, body in self.nodes().items():
            record = nodedata.trusted_record(body)
            w = gh.wanted(record, self.slurm_known(name))
            if w and record is not None:
                want[name] = w
                faults[name] = {q.index: q.fault for q in record.quarantined_gpus}
        if not want and not self.any_held:
            return {}
        jobs = await self.slurm.holders()
        self.any_held = bool(jobs)
        by_node: dict[str, list[gh.HoldJob]] = {}
        for j in jobs:
            by_node.setdefault(j.node, []).append(j)
        plans = {}
        for name in sorted(set(want) | set(by_node)):
            p = gh.plan(want.get(name, frozenset()), by_node.get(name, ()))
            if not p.cancel and not p.acquire:
                continue
            plans[name] = p
            log.info(
                "node=%s GPU holds: cancel %s, acquire GPU(s) %s%s",
                name,
                list(p.cancel) or "none",
                list(p.acquire) or "none",
                " (dry run: nothing written)" if self.dry_run else "",
            )
            if self.dry_run:
                continue
            await self.slurm.cancel(p.cancel)
            for index in p.acquire:
                if not await self._acquire(name, index, faults[name].get(index, "")):
                    break  # a lower GPU busy: the higher ones wait for the next pass too
        return plans

    async def _acquire(self, node: str, index: int, fault: str) -> bool:
        """Submit holders until one holds GPU ``index`` (spacers cancelled after); False
        when the GPU is in use (everything of the try cancelled, tried again next pass)."""
        spacers: list[int] = []
        try:
            for _ in range(index + 1):
                job = await self.slurm.submit(node, gh.comment(node, index, fault))
                landing = gh.landed(index, await self._started(job))
                if landing is gh.Landing.HELD:
                    log.info("node=%s GPU %d held by job %d", node, index, job)
                    self.any_held = True
                    return True
                spacers.append(job)
                if landing is gh.Landing.BUSY:
                    log.info("node=%s GPU %d is in use: held next pass", node, index)
                    return False
            return False
        finally:
            await self.slurm.cancel(spacers)

    async def _started(self, job: int) -> tuple[int, ...] | None:
        """The job's GPUs once it runs; None if it did not start within ``start_wait_s``."""
        deadline = self.clock.monotonic() + self.start_wait_s
        while True:
            gpus = await self.slurm.allocation(job)
            if gpus is not None or self.clock.monotonic() >= deadline:
                return gpus
            await asyncio.sleep(0.2)

    async def loop(self) -> None:
        said = ""
        while True:
            try:
                await self.reconcile()
                said = ""
            except asyncio.CancelledError:
                raise
            except SlurmError as exc:
                self.any_held = True  # read Slurm again next time
                text = str(exc)
                # the same failure again (no sbatch in the image, slurmctld down) is said once
                log.log(logging.DEBUG if text == said else logging.WARNING, "GPU holds: %s", text)
                said = text
            except Exception:
                self.any_held = True
                log.exception("GPU holds not reconciled")
            await asyncio.sleep(self.interval_s)
