"""Fault -> Slurm DRAIN while the syncer reads every node and job (decision 0221).

Once a minute the syncer reads all of ``/nodes`` and ``/jobs``; at 12,500 nodes that is
21 MB of JSON. This bench makes every read a full one, back to back on the syncer's own
event loop, and faults nodes one at a time meanwhile: each fault lands in a full read
(its request, slurmrestd's packing, the transfer or the parse). Prints fault -> DRAIN
p50/p99/max (from just before the PATCH of the problem condition to the DRAIN, the
syncer's clock, same process), beside the same faults with no read forced, and the
time one full read takes. Prints, never asserts. A local cluster with real slurmctld,
slurmd and slurmrestd (``--slurmd-nodes``: only that many get a slurmd; the others are
in slurm.conf only, as in bench/slurm_sync.py):

    .venv/bin/python bench/slurm_full_read.py --nodes 2000 --slurmd-nodes 50 --faults 50
    .venv/bin/python bench/slurm_full_read.py --nodes 12500 --slurmd-nodes 100 --faults 50
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local import processes
from gpufleet.local.cluster import ClusterSpec, running
from gpufleet.slurm.background import SyncerThread
from gpufleet.slurm.syncer import SyncSettings
from slurm_sync import fault_to_drain, in_production, pct, wait_until  # bench/


def during_full_reads(
    rs: SyncerThread, kube: SyncKube, names: list[str], count: int
) -> tuple[list[float], list[float]]:
    """Fault -> DRAIN (ms) with the syncer reading everything back to back, and how long
    each of those reads took (s)."""
    s = rs.syncer
    assert s is not None
    stop = threading.Event()
    took: list[float] = []

    async def read_back_to_back() -> None:
        while not stop.is_set():
            t = time.monotonic()
            await s.poll_slurm(full=True)
            took.append(time.monotonic() - t)

    reading = asyncio.run_coroutine_threadsafe(read_back_to_back(), rs.loop)
    try:
        wait_until("a first full read", lambda: bool(took), 300, 0.05)
        return fault_to_drain(s, kube, names, count, timeout=60), took
    finally:
        stop.set()
        reading.result(timeout=300)


def line(label: str, ms: list[float]) -> str:
    return (
        f"{label}: p50 {pct(ms, 50):.0f} ms, p99 {pct(ms, 99):.0f} ms, max {max(ms):.0f} ms"
        f" ({len(ms)} faults)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--slurmd-nodes", type=int, default=50, help="nodes with a slurmd")
    ap.add_argument("--faults", type=int, default=50, help="faults in each case")
    a = ap.parse_args()
    t0 = time.monotonic()
    spec = ClusterSpec(
        nodes=a.nodes, redfish=False, ready_timeout_s=900, slurmd_nodes=a.slurmd_nodes
    )
    with running(spec, progress=lambda m: print(f"  [{time.monotonic() - t0:6.1f}s] {m}")) as info:
        print(f"cluster up in {time.monotonic() - t0:.1f} s ({a.nodes} nodes)", flush=True)
        kube, endpoints = in_production(info)
        rs = SyncerThread(endpoints, SyncSettings(hold_taint=False))
        rs.start(timeout=600)
        try:
            names = info.node_names[: a.slurmd_nodes]
            assert rs.syncer is not None
            quiet = fault_to_drain(rs.syncer, kube, names, a.faults, timeout=60)
            busy, took = during_full_reads(rs, kube, names, a.faults)
        finally:
            rs.stop()
            kube.close()
        print(line("fault -> DRAIN, no read forced", quiet))
        print(line("fault -> DRAIN during full reads", busy))
        print(
            f"full reads meanwhile: {len(took)}, median {statistics.median(took) * 1000:.0f} ms,"
            f" max {max(took) * 1000:.0f} ms each (request, packing, transfer and parse)"
        )


if __name__ == "__main__":
    with processes.terminate_on_signals():  # a killed bench still stops its cluster
        main()
