"""What one Slurm user may see of another's work, and a job's private /tmp (pure).

Tenants share slurmctld, slurmdbd and the nodes. Two things keep them apart there
(decision 0286):

- ``PrivateData``: squeue, scontrol, sacct, sreport and sacctmgr show a user only
  their own jobs, usage, user record and accounts (root, SlurmUser and Slurm
  operators/administrators still see everything: the syncer reads as root).
  ``jobs`` is slurmctld's; ``usage``, ``users`` and ``accounts`` are slurmdbd's and
  mean something only with accounting.
- ``job_container/tmpfs``: each job gets its own ``/tmp`` and ``/dev/shm`` (a mount
  namespace, under ``BasePath``), removed when the job ends, so a job cannot read
  what another tenant's job left in /tmp on the same node. It needs
  ``PrologFlags=Contain`` (every job gets an extern step made at allocation).

Slurm 24.11 (the chart's images) has no PID namespace for jobs: that came with the
``namespace/linux`` plugin in 25.11. Other users' processes stay visible in ``ps`` on a
shared node; cgroups (``ConstrainDevices``) keep a job to its own GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

PRIVATE_DATA = ("accounts", "jobs", "usage", "users")
"""What every user sees only of their own (``PrivateData``)."""
JOB_CONTAINER = "job_container/tmpfs"
CONTAIN = "Contain"
"""The ``PrologFlags`` job_container/tmpfs needs."""
DEFAULT_BASE_PATH = "/var/spool/slurmd/job-tmp"
"""Where a job's private /tmp lives on its node (on slurmd's spool, node-local)."""
DEFAULT_DIRS = ("/tmp", "/dev/shm")


def private_data_line(kinds: Iterable[str] = PRIVATE_DATA) -> str | None:
    """``PrivateData=...`` (None when nothing is private)."""
    chosen = sorted(set(kinds))
    return f"PrivateData={','.join(chosen)}" if chosen else None


def prolog_flags_line(flags: Iterable[str]) -> str | None:
    """One ``PrologFlags`` line for every flag asked for (slurmctld reads only the last
    of two lines, so the health hooks' ``Alloc`` and ``Contain`` must share one)."""
    chosen = sorted(set(flags))
    return f"PrologFlags={','.join(chosen)}" if chosen else None


def merge_prolog_flags(lines: Sequence[str], extra: Iterable[str]) -> list[str]:
    """``lines`` with every ``PrologFlags=`` line folded into one (at the first one's
    place, or at the end) that also carries ``extra``."""
    flags = set(extra)
    out: list[str] = []
    at: int | None = None
    for line in lines:
        if line.startswith("PrologFlags="):
            flags.update(f for f in line.removeprefix("PrologFlags=").split(",") if f)
            if at is None:
                at = len(out)
                out.append("")
            continue
        out.append(line)
    merged = prolog_flags_line(flags)
    if merged is None:
        return [line for line in out if line] if at is not None else out
    if at is None:
        out.append(merged)
    else:
        out[at] = merged
    return out


def job_container_conf(
    base_path: str = DEFAULT_BASE_PATH,
    dirs: Sequence[str] = DEFAULT_DIRS,
    *,
    per_node: Sequence[tuple[str, str]] = (),
) -> str:
    """job_container.conf: ``AutoBasePath`` (slurmd makes ``BasePath`` itself) and the
    directories each job gets its own of. ``per_node``: (node, base path) lines instead of
    the one ``BasePath`` (several slurmds on one host, as the local cluster runs them, each
    need their own)."""
    lines = ["# Rendered by gpufleet: each job's private /tmp and /dev/shm (decision 0286)."]
    lines += ["AutoBasePath=true", f"Dirs={','.join(dirs)}"]
    if per_node:
        lines += [f"NodeName={node} BasePath={path}" for node, path in per_node]
    else:
        lines.append(f"BasePath={base_path}")
    return "\n".join(lines) + "\n"


def slurm_conf_lines(*, private_data: Iterable[str] = PRIVATE_DATA, job_tmpfs: bool) -> list[str]:
    """slurm.conf lines (PrologFlags apart: :func:`merge_prolog_flags` adds ``Contain``)."""
    lines = [line for line in (private_data_line(private_data),) if line]
    if job_tmpfs:
        lines.append(f"JobContainerType={JOB_CONTAINER}")
    return lines
