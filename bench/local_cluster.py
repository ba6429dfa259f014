"""Warm start and teardown of the local cluster, per component.

Usage: .venv/bin/python bench/local_cluster.py [--nodes 4] [--runs 3]

"Warm" means the binaries are built and the packages installed (run
scripts/bootstrap-system.sh first); every run still starts from an empty run
directory. Prints, for each run, the seconds from the start of ``up`` until
each component was ready, the total, and the teardown time, then the median
over the runs. Targets (issue 3): 4 nodes ready <= 20 s, teardown <= 10 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpufleet.local import processes
from gpufleet.local.cluster import ClusterSpec, LocalCluster


def one_run(nodes: int) -> tuple[dict[str, float], float, float]:
    cluster = LocalCluster(ClusterSpec(nodes=nodes))
    started = time.monotonic()
    info = cluster.start()
    total = time.monotonic() - started
    stopping = time.monotonic()
    cluster.stop()
    teardown = time.monotonic() - stopping
    left = processes.processes_using(info.run_dir)
    if left:
        raise SystemExit(f"processes left behind: {left}")
    return dict(info.ready_s), total, teardown


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    totals: list[float] = []
    teardowns: list[float] = []
    for run in range(1, args.runs + 1):
        ready, total, teardown = one_run(args.nodes)
        totals.append(total)
        teardowns.append(teardown)
        print(f"run {run}: {args.nodes} nodes")
        for name, seconds in sorted(ready.items(), key=lambda kv: kv[1]):
            print(f"  {seconds:6.2f} s  {name}")
        print(f"  {total:6.2f} s  all ready (warm start)")
        print(f"  {teardown:6.2f} s  teardown")
    print(
        f"median over {args.runs} runs: warm start {statistics.median(totals):.2f} s "
        f"(target <= 20), teardown {statistics.median(teardowns):.2f} s (target <= 10)"
    )


if __name__ == "__main__":
    main()
