"""What one pass of the live goodput ledger costs: a training's files, read and charged.

Writes the telemetry of one training of ``--nodes`` x ``--ranks`` ranks and
``--steps`` steps (one step a second; ``--groups`` replica groups, the nodes split
evenly) into a temporary directory, in which one group's first node stops halfway and a
replacement node takes its ranks over a minute later, with one closed NodeRemediation on
the stopped node. Then times ``gpufleet.lifecycle.goodput.compute`` (read the lines
through the telemetry codec, then the pure ledger), which ``gpufleet goodput --serve``
runs every ``--every`` seconds: the first pass (every line parsed), and a second one after
every rank wrote one more step (only those lines parsed; the ledger recomputed over all).
Prints JSON: lines, bytes, seconds of each pass, peak traced memory of the first.

    python bench/goodput_ledger.py --nodes 100 --ranks 8 --steps 1000 --groups 4
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

from gpufleet.lifecycle import goodput


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t))


def write(root: Path, nodes: int, ranks: int, steps: int, groups: int, t0: float) -> int:
    run = root / "bench.0"
    run.mkdir(parents=True)
    per_group = max(1, nodes // groups)
    stop, back = steps // 2, steps // 2 + 60
    written = 0
    for n in range(nodes):
        node = f"gpu-node-{n:04d}"
        group = f"g{min(n // per_group, groups - 1)}"
        for r in range(ranks):
            rank = n * ranks + r
            spans = [(node, 1, steps)]
            if n == 0:  # stops at half-way; node 9999 takes its ranks over later
                spans = [(node, 1, stop), ("gpu-node-9999", back + 1, steps)]
            for where, first, last in spans:
                lines = [
                    json.dumps(
                        {
                            "v": 1,
                            "job": "bench",
                            "run": 0,
                            "rank": rank,
                            "node": where,
                            "group": group,
                            "step": s,
                            "compute_s": 0.5,
                            "t": t0 + s,
                            "loss": 2.0,
                            "grad_norm": 1.0,
                        },
                        separators=(",", ":"),
                    )
                    for s in range(first, last + 1)
                ]
                text = "\n".join(lines) + "\n"
                with (run / f"rank-{rank}.{where}.jsonl").open("a") as f:
                    f.write(text)
                written += len(text)
    return written


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--groups", type=int, default=4)
    args = ap.parse_args()
    t0 = 1_700_000_000.0
    stop = t0 + args.steps // 2
    doc = {
        "metadata": {
            "name": "gpu-node-0000-1",
            "labels": {"app.kubernetes.io/managed-by": "gpufleet-controller"},
        },
        "spec": {"node": "gpu-node-0000", "fault": "xid-79"},
        "status": {
            "startedAt": _iso(stop + 30),
            "steps": [{"step": "gpu-reset", "startedAt": _iso(stop + 40)}],
            "completedAt": _iso(stop + 600),
        },
    }
    root = Path(tempfile.mkdtemp(prefix="goodput-bench-"))
    try:
        size = write(root, args.nodes, args.ranks, args.steps, args.groups, t0)
        reader = goodput.TelemetryReader(root)
        start = time.perf_counter()
        led = goodput.compute(reader, [doc])
        seconds = time.perf_counter() - start
        for f in sorted((root / "bench.0").iterdir()):  # one more step of every rank
            last = f.read_text().splitlines()[-1]
            step = json.loads(last)["step"]
            more = last.replace(f'"step":{step},', f'"step":{step + 1},', 1)
            more = more.replace(f'"t":{t0 + step}', f'"t":{t0 + step + 1}', 1)
            with f.open("a") as out:
                out.write(more + "\n")
        start = time.perf_counter()
        goodput.compute(reader, [doc])
        second = time.perf_counter() - start
        tracemalloc.start()  # a fresh pass for the memory: tracing slows it
        goodput.compute(root, [doc])
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        shutil.rmtree(root)
    (t,) = led.trainings
    print(
        json.dumps(
            {
                "nodes": args.nodes,
                "ranks": args.nodes * args.ranks,
                "steps": args.steps,
                "lines": args.nodes * args.ranks * args.steps - args.ranks * 60,
                "mib": round(size / 2**20, 1),
                "seconds": round(seconds, 2),
                "second_pass_seconds": round(second, 2),
                "peak_traced_mib": round(peak / 2**20, 1),
                "goodput": round(t.goodput, 5),
                "lost_gpu_seconds": {k: round(v) for k, v in t.lost.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
