"""People in the local cluster's Slurm 24.11 root, commands run as them, and the tenants'
isolation switched on in its running daemons.

The chart appends researchers' accounts to every Slurm pod's /etc/passwd (the
``slurm-users`` ConfigMap); here the same lines are appended to a copy of the root's
/etc/passwd and /etc/group, bound over the originals inside the root's own mount
namespace (the host's files are never changed, and the binds go with the namespace when
the cluster stops). A command then runs as a person through ``chroot --userspec``: munge
vouches for that uid, as it would for a user logged in to a login pod.

:func:`isolate` appends the lines the SlurmCluster operator renders
(:mod:`gpufleet.domain.slurm_isolation`) to the running cluster's slurm.conf and
slurmdbd.conf and has slurmctld and slurmdbd read them again, so a test of one module
gets them without a cluster of its own.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.domain import slurm_isolation
from gpufleet.local.cluster import ClusterInfo
from gpufleet.local.slurm_root import ROOT_PATH


@dataclass(frozen=True)
class Person:
    """A researcher's account: what the chart's ``slurm-users`` ConfigMap lists."""

    name: str
    uid: int
    gid: int


def _root(info: ClusterInfo) -> tuple[Path, int]:
    """The root's mount point and the pid whose mount namespace holds it."""
    if info.slurm_bin_dir is None:
        raise RuntimeError("people need the Slurm 24.11 root (slurm_version='24.11')")
    slurm = info.slurm_bin_dir.parent
    return slurm / "rootfs", int((slurm / "run" / "slurm-root.pid").read_text())


def _in_namespace(pid: int, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nsenter", f"--mount=/proc/{pid}/ns/mnt", "--", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )


def add_people(info: ClusterInfo, people: Iterable[Person]) -> None:
    """Append ``people`` to the root's /etc/passwd and /etc/group (as the chart's
    accounts init container does)."""
    mount_point, pid = _root(info)
    people = list(people)
    lines = {
        "passwd": [f"{p.name}:x:{p.uid}:{p.gid}::/tmp:/bin/sh" for p in people],
        "group": [f"{p.name}:x:{p.gid}:" for p in people],
    }
    for name, added in lines.items():
        target = mount_point / "etc" / name
        current = _in_namespace(pid, "cat", str(target)).stdout
        copy = info.run_dir / "slurm" / f"people-{name}"
        copy.write_text(current + "".join(line + "\n" for line in added))
        copy.chmod(0o644)
        _in_namespace(pid, "mount", "--bind", str(copy), str(target))


def as_person(info: ClusterInfo, person: Person, argv: Sequence[str], *, cwd: str = "/tmp",
              umask: str = "022") -> list[str]:  # fmt: skip
    """argv that runs ``argv`` in the root as ``person`` (pass ``env=info.slurm_env()``)."""
    mount_point, pid = _root(info)
    script = f'PATH={ROOT_PATH}; export PATH; umask {umask}; cd "$1" || exit 1; shift; exec "$@"'
    return [
        "nsenter", f"--mount=/proc/{pid}/ns/mnt", "--",
        "chroot", f"--userspec={person.uid}:{person.gid}", f"--groups={person.gid}",
        str(mount_point), "/bin/sh", "-c", script, "sh", cwd, *argv,
    ]  # fmt: skip


def isolate(info: ClusterInfo) -> None:
    """PrivateData as the operator renders it, in slurm.conf (slurmctld: jobs) and in
    slurmdbd.conf (slurmdbd: accounts, jobs, usage, users), read again by both daemons."""
    if info.slurm_conf is None:
        raise RuntimeError("isolation needs Slurm")
    line = slurm_isolation.private_data_line()
    assert line is not None
    for conf in (info.slurm_conf, info.slurm_conf.parent / "slurmdbd.conf"):
        if conf.exists() and line not in conf.read_text().splitlines():
            with conf.open("a") as f:
                f.write(line + "\n")
    env = info.slurm_env()
    for cmd in (["scontrol", "reconfigure"], ["sacctmgr", "-i", "reconfigure"]):
        subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30, check=True)
