"""How long a backup slurmctld takes to take over a killed primary, on real Slurm 24.11.

A local cluster with a primary and a backup slurmctld (``slurm_backup``, decision 0212).
Each run: a job running, the primary killed with SIGKILL once Slurm saved its state,
then the time until ``scontrol ping`` shows the backup UP (the primary DOWN) and a new
``sbatch`` is accepted: the *takeover*. Then the primary starts again and the time until
it is in control and accepts an ``sbatch``: the *handback*. Prints the median, min and
max of each, for the SlurmctldTimeout used; never asserts.

    .venv/bin/python bench/slurmctld_failover.py --runs 3 --slurmctld-timeout 5
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpufleet.local import processes, slurm
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster

PRIMARY, BACKUP = (name for name, _ in slurm.CONTROLLERS)


def ok(info: ClusterInfo, *args: str) -> bool:
    r = subprocess.run(args, env=info.slurm_env(), capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def up(info: ClusterInfo) -> tuple[str, ...]:
    r = subprocess.run(
        ["scontrol", "ping"], env=info.slurm_env(), capture_output=True, text=True, timeout=30
    )
    return slurm.parse_ping(r.stdout)


def until(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.1)


def accepted(info: ClusterInfo) -> bool:
    return ok(info, "sbatch", "-o", "/dev/null", "--wrap", "true")


def one_run(local: LocalCluster, info: ClusterInfo) -> tuple[float, float]:
    """(takeover, handback) seconds."""
    until("primary and backup", lambda: up(info) == (PRIMARY, BACKUP), 120)
    job = subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 30"],
        env=info.slurm_env(), capture_output=True, text=True, timeout=30, check=True,
    ).stdout.strip()  # fmt: skip
    until("running job", lambda: ok(info, "squeue", "-h", "-j", job, "-t", "R"), 30)
    state = Path(info.run_dir) / "slurm" / "state" / "job_state"
    seen = time.time()
    until("state save", lambda: state.exists() and state.stat().st_mtime > seen, 30)
    primary = next(p for p in reversed(info.processes) if p.name == f"slurmctld {PRIMARY}")
    t0 = time.monotonic()
    os.killpg(primary.pid, signal.SIGKILL)
    until("takeover", lambda: up(info) == (BACKUP,) and accepted(info), 120)
    takeover = time.monotonic() - t0
    t0 = time.monotonic()
    local.start_slurmctld(0)
    until("handback", lambda: up(info) == (PRIMARY, BACKUP) and accepted(info), 180)
    handback = time.monotonic() - t0
    ok(info, "scancel", job)
    return takeover, handback


def show(label: str, values: list[float]) -> None:
    print(
        f"  {label:<10} median {statistics.median(values):6.1f} s  "
        f"min {min(values):6.1f} s  max {max(values):6.1f} s  (n={len(values)})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="Failovers to measure.")
    ap.add_argument(
        "--slurmctld-timeout", type=int, default=5, help="SlurmctldTimeout, in seconds."
    )
    args = ap.parse_args()
    spec = ClusterSpec(
        nodes=2,
        redfish=False,
        slurm_version="24.11",
        slurm_backup=True,
        slurmctld_timeout_s=args.slurmctld_timeout,
    )
    local = LocalCluster(spec)
    with processes.terminate_on_signals(), local as info:
        runs = [one_run(local, info) for _ in range(args.runs)]
    timeout = args.slurmctld_timeout
    print(f"slurmctld failover, SlurmctldTimeout={timeout} s, {os.cpu_count()} cores")
    show("takeover", [t for t, _ in runs])
    show("handback", [h for _, h in runs])


if __name__ == "__main__":
    main()
