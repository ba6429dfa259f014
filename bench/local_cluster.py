"""Warm start and teardown of the local cluster, per component.

Usage: .venv/bin/python bench/local_cluster.py [--nodes 4] [--runs 3]
           [--slurm 24.11 [--slurm-accounting]]

"Warm" means the binaries are built and the packages installed (run
scripts/bootstrap-system.sh first); every run still starts from an empty run
directory. Prints, for each run, the seconds from the start of ``up`` until
each component was ready, the total, and the teardown time, then the median
over the runs, and the resident memory of each process when the cluster was
ready (the last run's). Targets (issue 3): 4 nodes ready <= 20 s, teardown <= 10 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpufleet.local import processes
from gpufleet.local.cluster import ClusterSpec, LocalCluster


def resident_mib(pid: int) -> float:
    """VmRSS of a process in MiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def one_run(spec: ClusterSpec) -> tuple[dict[str, float], float, float, dict[str, float]]:
    cluster = LocalCluster(spec)
    started = time.monotonic()
    info = cluster.start()
    total = time.monotonic() - started
    rss = {p.name: resident_mib(p.pid) for p in info.processes}
    stopping = time.monotonic()
    cluster.stop()
    teardown = time.monotonic() - stopping
    left = processes.processes_using(info.run_dir)
    if left:
        raise SystemExit(f"processes left behind: {left}")
    return dict(info.ready_s), total, teardown, rss


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--slurm", default="22.05", choices=["22.05", "24.11"])
    parser.add_argument(
        "--slurm-accounting", action="store_true", help="MariaDB and slurmdbd (24.11 only)"
    )
    args = parser.parse_args()
    spec = ClusterSpec(
        nodes=args.nodes, slurm_version=args.slurm, slurm_accounting=args.slurm_accounting
    )
    rss: dict[str, float] = {}
    totals: list[float] = []
    teardowns: list[float] = []
    for run in range(1, args.runs + 1):
        ready, total, teardown, rss = one_run(spec)
        totals.append(total)
        teardowns.append(teardown)
        print(f"run {run}: {args.nodes} nodes")
        for name, seconds in sorted(ready.items(), key=lambda kv: kv[1]):
            print(f"  {seconds:6.2f} s  {name}")
        print(f"  {total:6.2f} s  all ready (warm start)")
        print(f"  {teardown:6.2f} s  teardown")
    print("resident memory when ready (last run):")
    for name, mib in sorted(rss.items(), key=lambda kv: -kv[1]):
        print(f"  {mib:7.1f} MiB  {name}")
    print(
        f"median over {args.runs} runs: warm start {statistics.median(totals):.2f} s "
        f"(target <= 20), teardown {statistics.median(teardowns):.2f} s (target <= 10)"
    )


if __name__ == "__main__":
    main()
