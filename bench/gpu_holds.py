"""What Slurm does with a quarantined GPU held by the syncer's code, on real daemons.

A one-node local cluster (Slurm 24.11 by default); a job runs on GPUs 0-1; a record
quarantines GPU ``--gpu``; one pass of :class:`gpufleet.slurm.gpu_holds.GpuHolds` (the
syncer's code, with Slurm's own tools) holds it. Prints how long the pass took, which GPU
the holder has, and which GPUs (and ``CUDA_VISIBLE_DEVICES``) a new job asking for every
other free GPU is given; then the release. Never asserts (the test is
tests/integration/test_gpu_quarantine.py).

    .venv/bin/python bench/gpu_holds.py --slurm 24.11 --gpu 5
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from dataclasses import replace

from gpufleet.domain import gpu_holds as gh
from gpufleet.domain.records import NodeRecord, QuarantinedGpu, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.domain.well_known import ANNOTATION_RECORD
from gpufleet.local import processes
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster
from gpufleet.slurm.gpu_holds import CliConfig, GpuHolds, SlurmCli


def run(info: ClusterInfo, *args: str) -> str:
    r = subprocess.run(args, env=info.slurm_env(), capture_output=True, text=True, timeout=30)
    return r.stdout.strip()


def gpus_of(info: ClusterInfo, job: str) -> tuple[int, ...]:
    return gh.gpu_indexes(run(info, "scontrol", "-d", "-o", "show", "job", job))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--slurm", default="24.11", help="Slurm release of the local cluster")
    ap.add_argument("--gpu", type=int, default=5, help="the GPU index to quarantine (2-7)")
    args = ap.parse_args()
    spec = ClusterSpec(nodes=1, redfish=False, slurm_version=args.slurm)
    with processes.terminate_on_signals(), LocalCluster(spec) as info:
        node = info.node_names[0]
        print(run(info, "scontrol", "--version"))
        first = run(info, "sbatch", "--parsable", "-w", node, "--gres=gpu:2", "-n1", "--mem=1",
                    "-o", "/dev/null", "--wrap", "sleep 300")  # fmt: skip
        time.sleep(1.5)
        print(f"running job {first}: GPUs {gpus_of(info, first)}")
        rec = replace(
            NodeRecord.new(node, at=0, state=NodeState.PRODUCTION),
            quarantined_gpus=(QuarantinedGpu(args.gpu, "", "xid-94", 1.0),),
        )
        body = {"metadata": {"name": node, "annotations": {ANNOTATION_RECORD: record_to_json(rec)}}}
        bin_dir = str(info.slurm_bin_dir) if info.slurm_bin_dir else ""
        cli = SlurmCli(CliConfig(bin_dir=bin_dir, env={"SLURM_CONF": str(info.slurm_conf)}))
        holds = GpuHolds(cli, nodes=lambda: {node: body}, slurm_known=lambda _: True)
        t = time.monotonic()
        asyncio.run(holds.reconcile())
        took = time.monotonic() - t
        held = asyncio.run(cli.holders())
        print(f"one pass: {took:.1f} s; holders {[(j.job_id, j.gpus) for j in held]}")
        free = 8 - 2 - 1
        out = info.run_dir / "new.out"
        new = run(info, "sbatch", "--parsable", "-w", node, f"--gres=gpu:{free}", "-n1", "--mem=1",
                  "-o", str(out), "--wrap", "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 60")  # fmt: skip
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        text = out.read_text().strip() if out.exists() else "(no output)"
        print(f"new job asking for {free} GPUs: GPUs {gpus_of(info, new)}, {text}")
        body = {"metadata": {"name": node, "annotations": {ANNOTATION_RECORD: record_to_json(
            replace(rec, quarantined_gpus=()))}}}  # fmt: skip
        asyncio.run(holds.reconcile())
        time.sleep(1)
        print(f"released: holders {[(j.job_id, j.gpus) for j in asyncio.run(cli.holders())]}")
        run(info, "scancel", "-u", "root")


if __name__ == "__main__":
    main()
