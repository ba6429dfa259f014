"""The domain burn-in's all-reduce: one rank per task of an ``srun`` across an NVLink
domain's trays (``python -m gpufleet.health.domain_allreduce ARGS``).

Slurm places the ranks: ``SLURM_PROCID`` and ``SLURM_NTASKS`` are the rank and the
world, ``SLURMD_NODENAME`` the tray, ``SLURM_LOCALID`` the GPU on it; rank 0 runs on the
step's first node, whose ``NodeAddr`` holds the rendezvous (port ``base_port + job id %
1000``, as the gang preflight). The runs are :func:`gpufleet.domain.domain_burnin.runs`;
rank 0 prints them in nccl-tests' format, which the submitter reads with
:mod:`gpufleet.domain.nccl_tests` and judges with :func:`domain_burnin.judge`.

``ARGS`` is one JSON object: ``trays``, ``sizes`` (bytes), ``iters``, ``timeout_s``,
``base_port`` and ``faults`` (tray -> ``{"slow_s": s}`` or ``{"wrong": true}``: the
simulated backend's injection, refused by the command on GPUs).
"""

from __future__ import annotations

import json
import os
import resource
import sys
from collections.abc import Mapping
from typing import Any

from gpufleet.domain import domain_burnin
from gpufleet.health import _torch, preflight


def run(args: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """This task's rank; rank 0 returns the output to print."""
    node = env["SLURMD_NODENAME"]
    first = preflight.hostnames(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])[0]
    faults: Mapping[str, Any] = args.get("faults") or {}
    return _torch.domain_allreduce(
        rank=int(env["SLURM_PROCID"]),
        world=int(env["SLURM_NTASKS"]),
        node=node,
        local_rank=int(env.get("SLURM_LOCALID") or 0),
        addr=preflight.node_addr(first),
        port=preflight.port_of(int(args["base_port"]), int(env["SLURM_JOB_ID"])),
        phases=domain_burnin.runs(args["trays"]),
        sizes=[int(s) for s in args["sizes"]],
        iters=int(args["iters"]),
        fault=dict(faults.get(node) or {}),
        timeout_s=float(args["timeout_s"]),
    )


if __name__ == "__main__":
    # no core file: a rank whose peer vanished can abort inside gloo (see _torch's main)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    out = run(json.loads(sys.argv[1]), os.environ)
    if out:
        print(out, flush=True)
