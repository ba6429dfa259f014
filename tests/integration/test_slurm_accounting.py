"""Slurm accounting against real daemons: slurmctld and slurmdbd 24.11, MariaDB.

A cluster of its own (2 KWOK nodes, Slurm 24.11 with ``slurm_accounting``: the
host's MariaDB package in a private instance, the Slurm root's slurmdbd). slurm.conf's
accounting lines are the ones the SlurmCluster operator renders
(:func:`gpufleet.domain.slurm_accounting.slurm_conf_lines`). What an operator who
turns on ``slurm.accounting`` is promised: every job's GPUs are accounted
(``gres/gpu`` in ``sacct``'s ``AllocTRES``), a job requeued off a faulty node is
accounted as requeued with the GPUs it held there (the GPU time a fault cost), and
a slurmdbd that dies loses no record (slurmctld keeps them until it is back). And the
database alone, as the chart's slurmdbd on the machines would use it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_support import Kube, RunningSyncer
from waiting import wait_for

from gpufleet.domain import slurm_accounting
from gpufleet.local import processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster
from gpufleet.local.processes import ManagedProcess
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

NODE = "gpu-node-0001"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterInfo]:
    spec = ClusterSpec(nodes=2, redfish=False, slurm_version="24.11", slurm_accounting=True)
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        yield info
    assert not processes.processes_using(info.run_dir)


def run(info: ClusterInfo, *args: str, check: bool = True) -> str:
    r = subprocess.run(args, env=info.slurm_env(), capture_output=True, text=True, timeout=30)
    if check:
        assert r.returncode == 0, f"{' '.join(args)}: {r.stderr}"
    return r.stdout.strip()


def accounted(info: ClusterInfo, job: int, *, every_run: bool = False) -> list[dict[str, str]]:
    """sacct's allocation records of ``job`` (one per run with ``every_run``: ``-D``)."""
    fields = ("JobID", "State", "AllocTRES", "NodeList")
    out = run(
        info, "sacct", "-j", str(job), "-X", "-n", "-P", *(["-D"] if every_run else []),
        "-o", ",".join(fields), check=False,
    )  # fmt: skip
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines()]


def sbatch(info: ClusterInfo, *args: str) -> int:
    return int(run(info, "sbatch", "--parsable", *args))


def test_the_cluster_accounts_through_slurmdbd_with_the_operators_lines(
    cluster: ClusterInfo,
) -> None:
    assert cluster.slurm_accounting and cluster.slurm_conf is not None
    conf = cluster.slurm_conf.read_text().splitlines()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in conf
    assert f"AccountingStorageTRES={slurm_accounting.GPU_TRES}" in conf
    # slurmctld registered the cluster in slurmdbd by itself (no sacctmgr add cluster).
    clusters = run(cluster, "sacctmgr", "-n", "-P", "list", "cluster", "format=cluster")
    assert clusters.splitlines() == ["gpufleet"]


def test_a_jobs_gpus_are_accounted(cluster: ClusterInfo) -> None:
    job = sbatch(cluster, "--gres=gpu:3", "-N1", "--wrap", "sleep 1")

    def completed() -> dict[str, str] | None:
        rows = accounted(cluster, job)
        return rows[0] if rows and rows[0]["State"] == "COMPLETED" else None

    row = wait_for(f"job {job} COMPLETED in sacct", completed, 60)
    tres = slurm_accounting.parse_tres(row["AllocTRES"])
    assert slurm_accounting.gpus_of(tres) == 3, row
    assert tres["node"] == "1" and "cpu" in tres


def test_a_requeue_off_a_faulty_node_is_accounted_with_its_gpus(cluster: ClusterInfo) -> None:
    """The syncer drains a node on a fault and requeues its job (as in the 24.11 test);
    sacct keeps the interrupted run as REQUEUED on that node with the 8 GPUs it held."""
    kube = Kube(cluster)
    for n in cluster.node_names:
        kube.set_state(n, "production")
    syncer = RunningSyncer(cluster, SyncSettings(poll_interval_s=0.5, hold_taint=False))
    syncer.start()
    job = 0
    try:
        job = sbatch(cluster, "--requeue", "-w", NODE, "--gres=gpu:8", "--wrap", "sleep 600")
        wait_for(
            f"job {job} running",
            lambda: run(cluster, "squeue", "-h", "-j", str(job), "-o", "%T") == "RUNNING",
            20,
        )
        kube.set_condition(NODE, "GpuProblem", "True", "Xid79")

        def requeued_run() -> dict[str, str] | None:
            rows = accounted(cluster, job, every_run=True)
            return next((r for r in rows if r["State"] == "REQUEUED"), None)

        row = wait_for(f"job {job}'s requeued run in sacct", requeued_run, 60)
        assert row["NodeList"] == NODE
        assert slurm_accounting.gpus_of(slurm_accounting.parse_tres(row["AllocTRES"])) == 8
        kube.set_condition(NODE, "GpuProblem", "False", "Healthy")
    finally:
        if job:
            run(cluster, "scancel", str(job), check=False)
        syncer.stop()


def test_no_record_is_lost_while_slurmdbd_is_down(cluster: ClusterInfo) -> None:
    """Kill slurmdbd, run a job to the end, start slurmdbd again: the job reaches the
    database (slurmctld holds the records and sends them when slurmdbd is back)."""
    record = next(p for p in cluster.processes if p.name == "slurmdbd" and p.alive())
    os.kill(record.pid, signal.SIGKILL)
    wait_for("slurmdbd gone", lambda: not record.alive(), 10)
    job = sbatch(cluster, "--gres=gpu:1", "-N1", "--wrap", "true")
    wait_for(
        f"job {job} finished",
        lambda: run(cluster, "squeue", "-h", "-j", str(job), "-o", "%T", check=False) == "",
        30,
    )
    assert not accounted(cluster, job)  # sacct cannot answer: nothing to read from
    assert cluster.slurm_bin_dir is not None
    again = ManagedProcess(
        "slurmdbd",
        [cluster.slurm_bin_dir / "slurmdbd", "-D"],
        cluster.run_dir / "logs" / "slurmdbd-restarted.log",
        env=cluster.slurm_env(),
    ).start()
    try:

        def in_database() -> dict[str, str] | None:
            rows = accounted(cluster, job)
            return rows[0] if rows and rows[0]["State"] == "COMPLETED" else None

        row = wait_for(f"job {job} in sacct after slurmdbd restarted", in_database, 90)
        assert slurm_accounting.gpus_of(slurm_accounting.parse_tres(row["AllocTRES"])) == 1
    finally:
        again.stop()


def test_the_database_alone_for_a_slurmdbd_elsewhere() -> None:
    """Without Slurm here but with the machines readied for the chart (``images``), MariaDB
    runs alone: slurmdbd's account logs in over TCP with the password from the file and may
    create its database, and no other (what docs/install.md asks of an operator's database)."""
    spec = ClusterSpec(nodes=1, slurm=False, redfish=False, images=True, slurm_accounting=True)
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        db = info.accounting_db
        assert db is not None and db.machines_host == "10.0.2.100"
        assert not [p for p in info.processes if p.name == "slurmdbd"]
        password = Path(db.password_file).read_text().strip()

        def as_slurm(statement: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["mariadb", "--no-defaults", "-h", db.host, "-P", str(db.port), "-u", db.user,
                 f"-p{password}", "-N", "-B", "-e", statement],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip

        made = as_slurm(f"CREATE DATABASE {slurm_accounting.DEFAULT_DATABASE}; SELECT 1")
        assert made.returncode == 0 and made.stdout.strip() == "1", made.stderr
        other = as_slurm("CREATE DATABASE not_slurms")
        assert other.returncode != 0 and "denied" in other.stderr, other
    assert not processes.processes_using(info.run_dir)
