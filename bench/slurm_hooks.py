"""What gpufleet's Slurm hooks cost, on a local cluster's real Slurm. Prints, never asserts:

* a job's time from ``sbatch`` to the end of its epilog (the job is ``true``), without hooks,
  with ``gpufleet health check`` as Prolog and Epilog, and with the gang preflight
  (2-node jobs); the difference is the hooks' cost per job;
* the prolog's own duration, and the preflight's (rank 0's all-reduce, from the hook log).

    .venv/bin/python bench/slurm_hooks.py --jobs 5
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpufleet.domain import slurm_hooks
from gpufleet.local import slurm as local_slurm
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, running

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))


def run(info: ClusterInfo, *args: str) -> str:
    done = subprocess.run(args, env=info.slurm_env(), capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr}")
    return done.stdout


def job_seconds(info: ClusterInfo, nodes: int) -> float:
    """sbatch -> the job gone from the queue (its epilog done), in seconds."""
    t0 = time.monotonic()
    jid = run(info, "sbatch", "--parsable", "-o", "/dev/null", f"-N{nodes}", "--wrap", "true")
    while run(info, "squeue", "-h", "-j", jid.strip()).strip():
        if time.monotonic() - t0 > 300:
            raise RuntimeError(f"job {jid.strip()} did not finish in 300 s")
        time.sleep(0.05)
    return time.monotonic() - t0


def series(info: ClusterInfo, jobs: int, nodes: int) -> list[float]:
    return [job_seconds(info, nodes) for _ in range(jobs)]


def show(label: str, values: list[float]) -> None:
    print(
        f"  {label:<44} median {statistics.median(values):6.2f} s  "
        f"min {min(values):6.2f} s  max {max(values):6.2f} s  (n={len(values)})"
    )


def hook_seconds(log: Path, pattern: str) -> list[float]:
    found = [re.search(pattern, line) for line in log.read_text().splitlines()]
    return [float(m.group(1)) for m in found if m]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=5, help="Jobs per series.")
    ap.add_argument("--nodes", type=int, default=3, help="Local cluster nodes.")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    with running(ClusterSpec(nodes=args.nodes, redfish=False)) as info:
        conf = Path(info.slurm_conf or "")
        plain1 = series(info, args.jobs, 1)
        plain2 = series(info, args.jobs, 2)
        hook_dir = Path(tempfile.mkdtemp(prefix="gpufleet-hooks-"))
        log = hook_dir / "log"
        cfg = slurm_hooks.HookConfig(
            gpufleet=GPUFLEET,
            checks=("gpu-count", "gpu-xid", "gpu-memory", "nvlink", "pcie", "infiniband"),
            extra_args=("--backend", "simulated"),
            preflight=True,
            preflight_timeout_s=30,
            log_file=str(log),
        )
        before = local_slurm.enable_health_hooks(conf, hook_dir, cfg)
        try:
            run(info, "scontrol", "reconfigure")
            time.sleep(2)
            hooked1 = series(info, args.jobs, 1)
            hooked2 = series(info, args.jobs, 2)
        finally:
            local_slurm.restore_conf(conf, before)
            run(info, "scontrol", "reconfigure")
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
        print("sbatch -> job gone from the queue (job: true)")
        show("1 node, no hooks", plain1)
        show("1 node, prolog + epilog checks", hooked1)
        show("2 nodes, no hooks", plain2)
        show("2 nodes, prolog + epilog checks + gang preflight", hooked2)
        cost1 = statistics.median(hooked1) - statistics.median(plain1)
        cost2 = statistics.median(hooked2) - statistics.median(plain2)
        print(
            f"  cost per job (medians): 1 node {cost1:+.2f} s, 2 nodes + preflight {cost2:+.2f} s"
        )
        checks = hook_seconds(log, r"--slurm prolog .*seconds=([0-9.]+)")
        pre = hook_seconds(log, r"preflight: job=\d+ rank=0/2 seconds=([0-9.]+) ok=True")
        show("prolog checks (child process, each node)", checks)
        if pre:
            show("preflight all-reduce (rank 0, after import)", pre)


if __name__ == "__main__":
    main()
