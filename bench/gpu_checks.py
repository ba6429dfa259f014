"""Run the full node check suite on this machine's GPUs with the real backend.

Prints one JSON document: NVML readings per GPU, every check's status,
measured value, threshold and duration, plus GEMM TFLOP/s and HBM GB/s per
GPU. Needs the ``gpu`` extra (torch with CUDA) and the NVIDIA driver; DCGM
and the all-reduce are reported as "unknown" where absent (one GPU, no dcgmi).

    python bench/gpu_checks.py [--sku h200] [--iters 10] [--dcgm-level 1]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

from gpufleet.health import checks, nvml_values, skus
from gpufleet.health.backend_real import RealHardware
from gpufleet.health.hardware import NoGpuFound


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sku", default="")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--dcgm-level", type=int, default=1)
    ap.add_argument("--checks", default=",".join(checks.ALL))
    args = ap.parse_args()
    hw = RealHardware()
    host = socket.gethostname()
    out: dict[str, object] = {"host": host, "started": time.time()}
    try:
        try:
            raw = hw.gpus()
        except NoGpuFound as exc:
            print(json.dumps({"error": f"no GPU found: {exc}"}))
            return 3
        out["nvml"] = raw
        readings = [r for r in (nvml_values.parse_gpu(g) for g in raw) if r is not None]
        profile = skus.choose(
            skus.bundled(), sku=args.sku or None, gpu_names=[r.name or "" for r in readings]
        )
        out["profile"] = profile.name
        t0 = time.perf_counter()
        results = checks.run_checks(
            hw,
            profile,
            args.checks.split(","),
            node=host,
            iters=args.iters,
            dcgm_level=args.dcgm_level,
        )
        out["total_seconds"] = round(time.perf_counter() - t0, 3)
        out["checks"] = [r.as_json() for r in results]
        by = {r.name: r for r in results}
        out["gemm_tflops"] = by["gemm"].details.get("tflops") if "gemm" in by else None
        out["hbm_gbps"] = by["hbm"].details.get("gbps") if "hbm" in by else None
        out["durations_s"] = {r.name: round(r.duration_s, 4) for r in results}
    finally:
        hw.close()
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
