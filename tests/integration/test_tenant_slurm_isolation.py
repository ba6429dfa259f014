"""Tenants' boundaries in Slurm, on real daemons: slurmctld, slurmd and slurmdbd 24.11 with
MariaDB, two tenants' people submitting as their own uid (munge vouches for it).

With the PrivateData the SlurmCluster operator renders
(:mod:`gpufleet.domain.slurm_isolation`), one tenant's user sees none of another's jobs in
squeue or scontrol, none of their records in sacct, none of their accounts or associations
in sacctmgr, and cannot cancel them; the files a job writes are its user's, and with the
user's umask the other tenant cannot read them. root sees everything (the syncer and the
tenant controller read as root). A cluster of its own (2 KWOK nodes, no Redfish).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from gpufleet.local import processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster
from gpufleet.local.slurm_people import Person, add_people, as_person, isolate

pytestmark = pytest.mark.integration

ALICE = Person("alice", 20001, 20001)  # tenant vision
BOB = Person("bob", 20002, 20002)  # tenant speech
ACCOUNTS = {ALICE: "vision", BOB: "speech"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterInfo]:
    spec = ClusterSpec(nodes=2, redfish=False, slurm_version="24.11", slurm_accounting=True)
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        add_people(info, ACCOUNTS)
        for person, account in ACCOUNTS.items():
            root(info, "sacctmgr", "-i", "add", "account", account, f"description=tenant {account}")
            root(info, "sacctmgr", "-i", "add", "user", person.name, f"account={account}")
        isolate(info)
        yield info
    assert not processes.processes_using(info.run_dir)


@pytest.fixture(scope="module")
def shared(cluster: ClusterInfo) -> Iterator[Path]:
    """A directory every user may write (as /tmp is), where the jobs start."""
    path = Path(tempfile.mkdtemp(prefix="gpufleet-tenants-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def root(info: ClusterInfo, *args: str) -> str:
    r = subprocess.run(args, env=info.slurm_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
    return r.stdout.strip()


def person(info: ClusterInfo, who: Person, *args: str, cwd: str = "/tmp",
           umask: str = "022") -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        as_person(info, who, args, cwd=cwd, umask=umask),
        env=info.slurm_env(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def submit(info: ClusterInfo, who: Person, cwd: Path, command: str) -> int:
    """A job of ``who``'s, submitted from ``cwd`` with umask 077 (only its user reads
    what it writes), its output in ``<name>-<job>.out``."""
    r = person(
        info, who, "sbatch", "--parsable", f"--account={ACCOUNTS[who]}", "-N1",
        f"--output={who.name}-%j.out", "--wrap", command, cwd=str(cwd), umask="077",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


def job_ids(text: str) -> set[int]:
    return {int(w) for w in text.split() if w.isdigit()}


@pytest.fixture(scope="module")
def jobs(cluster: ClusterInfo, shared: Path) -> Iterator[dict[Person, int]]:
    """A running job of each tenant's user (each writes a file of its own first)."""
    out = {
        who: submit(cluster, who, shared, f"echo secret of {who.name} > {who.name}.data; sleep 120")
        for who in ACCOUNTS
    }

    def running(job: int) -> bool:
        return root(cluster, "squeue", "-h", "-j", str(job), "-o", "%T") == "RUNNING"

    for who, job in out.items():
        wait_for(f"{who.name}'s job {job} running", functools.partial(running, job), 30)
        wait_for(f"{who.name}.data written", (shared / f"{who.name}.data").exists, 15)
    try:
        yield out
    finally:
        root(cluster, "scancel", *(str(j) for j in out.values()))


def test_squeue_and_scontrol_show_a_user_only_their_own_jobs(
    cluster: ClusterInfo, jobs: dict[Person, int]
) -> None:
    assert job_ids(root(cluster, "squeue", "-h", "-o", "%i")) >= set(jobs.values())
    for who, own in jobs.items():
        other = jobs[BOB if who is ALICE else ALICE]
        seen = person(cluster, who, "squeue", "-h", "-o", "%i")
        assert seen.returncode == 0, seen.stderr
        assert job_ids(seen.stdout) == {own}
        shown = person(cluster, who, "scontrol", "show", "job", str(other))
        assert shown.returncode != 0 and str(other) not in shown.stdout, shown
        assert person(cluster, who, "scontrol", "show", "job", str(own)).returncode == 0


def test_a_user_cannot_cancel_or_hold_another_tenants_job(
    cluster: ClusterInfo, jobs: dict[Person, int]
) -> None:
    alices = str(jobs[ALICE])
    cancel = person(cluster, BOB, "scancel", alices)
    hold = person(cluster, BOB, "scontrol", "hold", alices)
    assert "Access/permission denied" in cancel.stderr + hold.stderr, (cancel, hold)
    assert root(cluster, "squeue", "-h", "-j", alices, "-o", "%T") == "RUNNING"


def test_a_jobs_files_are_its_users_and_unreadable_to_the_other_tenant(
    cluster: ClusterInfo, shared: Path, jobs: dict[Person, int]
) -> None:
    for who in ACCOUNTS:
        for path in (shared / f"{who.name}.data", shared / f"{who.name}-{jobs[who]}.out"):
            st = path.stat()
            assert (st.st_uid, st.st_gid) == (who.uid, who.gid), path
            assert st.st_mode & 0o077 == 0, oct(st.st_mode)  # the submitter's umask 077
    read = person(cluster, BOB, "cat", "alice.data", cwd=str(shared))
    assert read.returncode != 0 and "Permission denied" in read.stderr, read
    own = person(cluster, ALICE, "cat", "alice.data", cwd=str(shared))
    assert own.stdout.strip() == "secret of alice"


def test_sacct_and_sacctmgr_show_a_user_only_their_own(
    cluster: ClusterInfo, jobs: dict[Person, int]
) -> None:
    def recorded() -> bool:
        out = root(cluster, "sacct", "-a", "-X", "-n", "-o", "JobID")
        return job_ids(out) >= set(jobs.values())

    wait_for("both jobs in slurmdbd", recorded, 30)
    for who, own in jobs.items():
        rows = person(cluster, who, "sacct", "-a", "-X", "-n", "-o", "JobID")
        assert rows.returncode == 0, rows.stderr
        assert job_ids(rows.stdout) == {own}, rows.stdout
        assoc = person(cluster, who, "sacctmgr", "-n", "-P", "show", "assoc", "format=account,user")
        assert assoc.returncode == 0, assoc.stderr
        assert {tuple(r.split("|")) for r in assoc.stdout.split()} <= {
            (ACCOUNTS[who], who.name),
            (ACCOUNTS[who], ""),
        }, assoc.stdout
        users = person(cluster, who, "sacctmgr", "-n", "-P", "show", "user", "format=user")
        assert users.stdout.split() == [who.name], users.stdout
    everyone = root(cluster, "sacctmgr", "-n", "-P", "show", "assoc", "format=account")
    assert {"vision", "speech"} <= set(everyone.split())
