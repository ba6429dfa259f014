"""slurmctld without a single point of failure: a backup takes over a killed primary.

A cluster of its own (2 KWOK nodes, Slurm 24.11, ``slurm_backup``): two slurmctlds
on one StateSaveLocation, each under its ``SlurmctldHost`` name and loopback
address (decision 0212). Two jobs run and one is pending when the primary is
killed with SIGKILL; the backup takes over after SlurmctldTimeout (5 s here), knows
every job, lets the running ones finish and starts the pending one, and accepts a
new one. Then the primary starts again and takes control back (Slurm's default,
with no ``SlurmctldPrimaryOnProg``), the jobs still known.

Slurm saves its state at most every 5 s (``SAVE_MAX_WAIT`` in slurmctld): what
changed in the primary's last seconds before a crash is not in the state the
backup reads. The test kills the primary once a save written after the jobs were
seen running is on disk (the loss window is in docs/slurm.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_support import wait_for

from gpufleet.local import processes, slurm
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster

pytestmark = pytest.mark.integration

PRIMARY, BACKUP = (name for name, _ in slurm.CONTROLLERS)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalCluster, ClusterInfo]]:
    spec = ClusterSpec(
        nodes=2, redfish=False, slurm_version="24.11", slurm_backup=True, slurmctld_timeout_s=5
    )
    local = LocalCluster(spec)
    with processes.terminate_on_signals(), local as info:
        yield local, info
    assert not processes.processes_using(info.run_dir)


def run(info: ClusterInfo, *args: str) -> str:
    r = subprocess.run(args, env=info.slurm_env(), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
    return r.stdout.strip()


def up(info: ClusterInfo) -> tuple[str, ...]:
    r = subprocess.run(
        ["scontrol", "ping"], env=info.slurm_env(), capture_output=True, text=True, timeout=30
    )
    return slurm.parse_ping(r.stdout)


def jobs(info: ClusterInfo) -> dict[str, str]:
    """Job id -> state of every job the controller in control knows (finished ones too,
    for MinJobAge); empty when none answers (a backup in standby refuses)."""
    r = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i %T"],
        env=info.slurm_env(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return dict(line.split() for line in r.stdout.splitlines()) if r.returncode == 0 else {}


def primary_starts(info: ClusterInfo) -> int:
    """How often the primary took control (its log: the first start and each return)."""
    log = Path(info.run_dir) / "logs" / "slurmctld.log"
    return log.read_text().count("Running as primary controller")


def sbatch(info: ClusterInfo, *args: str) -> str:
    return run(info, "sbatch", "--parsable", "-o", "/dev/null", *args)


def saved_since(info: ClusterInfo, t: float) -> bool:
    """slurmctld wrote its job state (a new file, renamed into place) after ``t``."""
    state = Path(info.run_dir) / "slurm" / "state" / "job_state"
    return state.exists() and state.stat().st_mtime > t


def test_the_backup_takes_over_a_killed_primary_and_gives_control_back(
    cluster: tuple[LocalCluster, ClusterInfo],
) -> None:
    local, info = cluster
    assert up(info) == (PRIMARY, BACKUP)
    nodes = info.node_names
    running = [sbatch(info, "-w", n, "--gres=gpu:8", "--wrap", "sleep 25") for n in nodes]
    pending = sbatch(info, "--gres=gpu:8", "--wrap", "sleep 1")
    wait_for(
        "two jobs running, one pending",
        lambda: (
            [jobs(info).get(j) for j in (*running, pending)] == ["RUNNING", "RUNNING", "PENDING"]
        ),
        20,
        0.5,
    )
    seen = time.time()
    wait_for("a state save after the jobs ran", lambda: saved_since(info, seen), 15)

    primary = next(p for p in info.processes if p.name == f"slurmctld {PRIMARY}")
    os.killpg(primary.pid, signal.SIGKILL)
    # A backup in standby answers a ping too: in control once it answers squeue.
    wait_for("the backup in control", lambda: up(info) == (BACKUP,) and jobs(info), 40, 0.5)
    # Every job is still known, and the running ones still run (their slurmd kept them).
    assert [jobs(info).get(j) for j in running] == ["RUNNING", "RUNNING"]
    assert jobs(info).get(pending) in ("PENDING", "RUNNING", "COMPLETED")
    new = sbatch(info, "--wrap", "true")
    wait_for(
        "every job completed under the backup",
        lambda: all(jobs(info).get(j) == "COMPLETED" for j in (*running, pending, new)),
        40,
        0.5,
    )

    # The primary comes back: it asks the backup for control and takes it (the backup
    # waits up to 30 s for its own shutdown first: docs/slurm.md, Controller failover).
    assert primary_starts(info) == 1
    local.start_slurmctld(0)
    wait_for(
        "the primary back in control",
        lambda: primary_starts(info) == 2 and up(info) == (PRIMARY, BACKUP) and jobs(info),
        60,
        0.5,
    )
    assert all(jobs(info).get(j) == "COMPLETED" for j in (*running, pending, new))
    last = sbatch(info, "--wrap", "true")
    wait_for("a job under the primary", lambda: jobs(info).get(last) == "COMPLETED", 20, 0.5)
