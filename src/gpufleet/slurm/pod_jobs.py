"""The pod scheduler's Slurm jobs, through Slurm's command-line tools (decision 0260).

A pod group is one Slurm job (docs/decisions/0257): :meth:`PodJobsCli.submit` asks
``sbatch`` for what :class:`~gpufleet.domain.pod_groups.JobRequest` says (one node per
pod, the largest member's GPUs as GRES, CPUs, memory, time, partition, account, QOS,
priority) with a job that only sleeps on its allocation; :meth:`PodJobsCli.jobs` finds
every such job again with ONE ``squeue`` call, by its comment, in any state Slurm still
keeps; :meth:`PodJobsCli.cancel` and :meth:`PodJobsCli.requeue` end or move one (a
requeued job is kept off the nodes Kubernetes found unfit).

The command-line tools, not slurmrestd: they are what the syncer's GPU holders and the
domain burn-in already use (same authentication: munge or ``SLURM_JWT``), they speak
every Slurm release the project runs the same way, and ``squeue -o`` gives exactly the
five fields needed in one line per job. Their text is read in one place,
:func:`parse_jobs` / :func:`parse_submitted` / :func:`refusal`.

Each scheduler name has its own comment prefix (:func:`comment_prefix`): the default
name's is :data:`~gpufleet.domain.well_known.POD_JOB_COMMENT_PREFIX`, another name's is
``gpufleet-pods@<name>:``, which the default's does not match. Two schedulers on one
Slurm (a team's own, a test's) therefore never read, cancel or requeue each other's jobs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.domain import hostlist, well_known
from gpufleet.domain.pod_groups import GroupKey, JobRequest, SlurmJob
from gpufleet.slurm.errors import SlurmCommandFailed, SlurmError, SlurmUnavailable
from gpufleet.slurm.scontrol import run_tool

SQUEUE_FORMAT = "%i|%T|%N|%r|%k"
"""Job id, state, nodes, reason, comment: the comment last (it may hold a ``|``)."""

WRAP = "exec sleep infinity"
"""What the job runs on its allocation: nothing; the pods are the work."""

TRANSIENT = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Zero Bytes were transmitted",
    "Slurm temporarily unable",
    "in standby mode",
    "Communication connection failure",
    "Connection refused",
)
"""Words of an sbatch failure that say slurmctld did not answer, not that it refused."""


NEVER_STARTS = frozenset(
    {
        "BadConstraints",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "PartitionConfig",
        "InvalidAccount",
        "InvalidQOS",
        "QOSMaxNodePerJobLimit",
        "QOSMaxGRESPerJob",
        "QOSMaxCpuPerJobLimit",
        "QOSMaxMemoryPerJob",
        "QOSMaxWallDurationPerJobLimit",
        "AssocMaxNodesPerJobLimit",
        "AssocMaxGRESPerJob",
        "AssocMaxCpuPerJobLimit",
        "AssocMaxMemPerJob",
        "AssocMaxWallDurationPerJobLimit",
    }
)
"""Pending reasons that say the job will never start as it was asked (bigger than its
partition, more than a per-job limit): Slurm 22.05 accepts a job of more nodes than its
partition has and keeps it pending with ``PartitionNodeLimit`` where 24.11 refuses it at
``sbatch``. Any other reason (Resources, Priority, BeginTime, a held job...) can pass."""


def never_starts(job: SlurmJob) -> bool:
    """Whether a pending job waits for something that will not come."""
    return job.word == "PENDING" and job.reason in NEVER_STARTS


class SubmitRefused(SlurmError):
    """Slurm refused the job (unknown partition, account or QOS, a group too big for the
    partition, a bad option): waiting does not help; ``message`` is Slurm's own."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class PodJobPort(Protocol):
    """What the pod scheduler needs of Slurm."""

    async def jobs(self) -> list[SlurmJob]:
        """Every job of this scheduler that Slurm still lists, in any state."""
        ...

    async def submit(self, request: JobRequest) -> int:
        """Submit the group's job; its id. :class:`SubmitRefused` when Slurm refuses."""
        ...

    async def cancel(self, job_id: int) -> None: ...

    async def requeue(self, job_id: int, exclude: Sequence[str] = ()) -> None:
        """Put a running job back in the queue; ``exclude``: nodes it may not get again."""
        ...


def comment_prefix(scheduler_name: str) -> str:
    """The comment prefix of the jobs of the scheduler called ``scheduler_name``."""
    if scheduler_name == well_known.POD_SCHEDULER_NAME:
        return well_known.POD_JOB_COMMENT_PREFIX
    return f"{well_known.POD_JOB_COMMENT_PREFIX.rstrip(':')}@{scheduler_name}:"


def sbatch_args(request: JobRequest, prefix: str) -> list[str]:
    """sbatch's arguments for ``request`` (the program name excluded)."""
    r = request
    gpu = f"gpu:{r.gpu_type}:{r.gpus_per_node}" if r.gpu_type else f"gpu:{r.gpus_per_node}"
    optional = [
        (r.gpus_per_node > 0, f"--gres={gpu}"),
        (r.cpus_per_node > 0, f"--cpus-per-task={r.cpus_per_node}"),
        # --mem=0 would ask for every byte of the node: no request, no option
        (r.mem_mib is not None and r.mem_mib > 0, f"--mem={r.mem_mib}"),
        (r.time_minutes is not None, f"--time={r.time_minutes}"),
        (r.partition is not None, f"--partition={r.partition}"),
        (r.account is not None, f"--account={r.account}"),
        (r.qos is not None, f"--qos={r.qos}"),
        (r.priority is not None, f"--priority={r.priority}"),
    ]
    return [
        "--parsable",
        f"--job-name={r.job_name}",
        f"--comment={prefix}{r.key.tag}",
        f"--nodes={r.nodes}",
        "--ntasks-per-node=1",
        *(arg for wanted, arg in optional if wanted),
        "--requeue",
        "--chdir=/tmp",
        "--output=/dev/null",
        "--error=/dev/null",
        f"--wrap={WRAP}",
    ]


def parse_submitted(text: str) -> int:
    """``sbatch --parsable``: ``JOBID`` or ``JOBID;CLUSTER``."""
    first = text.strip().split(";", 1)[0]
    if not first.isdigit():
        raise SlurmUnavailable(f"sbatch answered {text.strip()!r}, not a job id")
    return int(first)


def refusal(stderr: str) -> str:
    """Slurm's reason from sbatch's error output (its last ``error:`` line, without the
    tool's preamble): what the pods' condition and Event say."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln] or lines or ["sbatch refused the job"]
    text = errors[-1].split("error:", 1)[-1].strip()
    return text.removeprefix("Batch job submission failed:").strip() or errors[-1]


def parse_jobs(text: str, prefix: str) -> list[SlurmJob]:
    """``squeue -h --states=all -o`` :data:`SQUEUE_FORMAT`: the jobs whose comment starts
    with ``prefix`` and carries a group key; every other line (other users' jobs, array
    tasks, a comment that names no key) is not this scheduler's."""
    found = []
    for line in text.splitlines():
        parts = line.split("|", 4)
        if len(parts) != 5 or not parts[0].isdigit() or not parts[4].startswith(prefix):
            continue
        job_id, state, nodes, reason, comment = parts
        key = GroupKey.from_tag(comment[len(prefix) :].strip())
        if key is None:
            continue
        names = tuple(hostlist.expand(nodes)) if nodes and nodes != "(null)" else ()
        found.append(
            SlurmJob(
                job_id=int(job_id),
                key=key,
                state=state.strip().split()[0] if state.strip() else "UNKNOWN",
                nodes=names,
                reason="" if reason in ("None", "(null)") else reason,
            )
        )
    return found


@dataclass(frozen=True, slots=True)
class PodJobsConfig:
    scheduler_name: str = well_known.POD_SCHEDULER_NAME
    bin_dir: str = ""
    """Where sbatch, squeue, scontrol and scancel are ("": on PATH)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment of the tools: ``SLURM_CONF``, optionally ``SLURM_JWT``."""
    timeout_s: float = 15.0


class PodJobsCli:
    """:class:`PodJobPort` through sbatch, squeue, scancel and scontrol."""

    def __init__(self, config: PodJobsConfig) -> None:
        self.config = config
        self.prefix = comment_prefix(config.scheduler_name)

    async def _run(self, tool: str, *args: str) -> str:
        path = os.path.join(self.config.bin_dir, tool) if self.config.bin_dir else tool
        return await run_tool([path, *args], self.config.env, self.config.timeout_s)

    async def jobs(self) -> list[SlurmJob]:
        text = await self._run("squeue", "-h", "--states=all", "-o", SQUEUE_FORMAT)
        return parse_jobs(text, self.prefix)

    async def submit(self, request: JobRequest) -> int:
        try:
            out = await self._run("sbatch", *sbatch_args(request, self.prefix))
        except SlurmCommandFailed as e:
            if any(word in e.stderr for word in TRANSIENT):
                raise SlurmUnavailable(e.stderr) from e
            raise SubmitRefused(refusal(e.stderr)) from e
        return parse_submitted(out)

    async def cancel(self, job_id: int) -> None:
        await self._run("scancel", str(job_id))

    async def requeue(self, job_id: int, exclude: Sequence[str] = ()) -> None:
        """``scontrol requeue``, then the job kept off ``exclude``: nodes Kubernetes found
        unfit (a cordon or taint) are no Slurm drain, and Slurm would give them back."""
        await self._run("scontrol", "requeue", str(job_id))
        if exclude:
            names = hostlist.compress(sorted(exclude))
            await self._run("scontrol", "update", f"JobId={job_id}", f"ExcNodeList={names}")
