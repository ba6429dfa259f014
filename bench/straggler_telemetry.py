"""What job telemetry costs one node's agent: a big job's files, read and judged.

Writes the telemetry of one run of a ``--nodes`` x ``--ranks`` job (``--steps``
steps already written, one node 40% slower) into a temporary directory, then
times the agent's reader (``gpufleet.health.telemetry.JobTelemetry``) for the
slow node and for a healthy one: the first look (what was there is history:
skipped), reading ``--window`` new steps and judging them, and one
steady-state poll after one more step of every rank. Prints JSON.

With ``--groups G`` the job is a training of G replica groups (the nodes split
evenly): every line also carries its group, a loss and a gradient norm, and every
fifth step a weights fingerprint, which the slow node's ranks get wrong, so the
reader's vote (``gpufleet.domain.sdc_vote``) runs as well and names that node.

    python bench/straggler_telemetry.py --nodes 1000 --ranks 8 --steps 200
    python bench/straggler_telemetry.py --nodes 1000 --ranks 8 --steps 200 --groups 4
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from gpufleet.domain.policy import Stragglers
from gpufleet.domain.stragglers import StepSample, rank_file_name, sample_line
from gpufleet.health.telemetry import JobTelemetry


def write_steps(
    run: Path, nodes: int, ranks: int, steps: range, slow: str, t0: float, groups: int = 0
) -> int:
    """Append ``steps`` for every rank; returns the bytes written."""
    written = 0
    for n in range(nodes):
        node = f"gpu-node-{n:04d}"
        pace = 0.5 / 0.6 if node == slow else 0.5
        group = f"g{n * groups // nodes}" if groups else None
        for r in range(ranks):
            rank = n * ranks + r
            lines = "".join(
                sample_line(
                    StepSample(
                        "4242",
                        0,
                        rank,
                        node,
                        s,
                        pace,
                        t0 + s,
                        group=group,
                        fingerprint=_fingerprint(s, node == slow) if group else None,
                        loss=2.0 if group else None,
                        grad_norm=0.5 if group else None,
                    )
                )
                + "\n"
                for s in steps
            )
            with (run / rank_file_name(rank, node)).open("a") as f:
                f.write(lines)
            written += len(lines)
    return written


def _fingerprint(step: int, corrupt: bool) -> str | None:
    """Every fifth step: the same for every rank, another one on the corrupt node."""
    if step % 5:
        return None
    return f"{step + (1 << 40 if corrupt else 0):016x}"


def timed(fn: object) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()  # type: ignore[operator]
    return time.perf_counter() - start, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=8, help="ranks (GPUs) per node")
    ap.add_argument("--steps", type=int, default=200, help="steps written before the agent starts")
    ap.add_argument("--window", type=int, default=50, help="detection.stragglers.windowSteps")
    ap.add_argument(
        "--groups", type=int, default=0, help="replica groups (0: a plain data-parallel job)"
    )
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpufleet-telemetry-bench-"))
    try:
        run = root / "4242.0"
        run.mkdir()
        slow, healthy = "gpu-node-0007", "gpu-node-0500"
        t0 = time.time() - args.steps - args.window - 10
        g = args.groups
        history_bytes = write_steps(
            run, args.nodes, args.ranks, range(1, args.steps + 1), slow, t0, g
        )
        config = Stragglers(window_steps=args.window, report_every_seconds=1800)
        readers = {n: JobTelemetry(root, n, config) for n in (slow, healthy)}
        first = {n: timed(lambda r=r: r.poll(time.time()))[0] for n, r in readers.items()}
        new = range(args.steps + 1, args.steps + args.window + 1)
        write_steps(run, args.nodes, args.ranks, new, slow, t0, g)
        judged = {n: timed(lambda r=r: r.poll(time.time())) for n, r in readers.items()}
        write_steps(run, args.nodes, args.ranks, range(new.stop, new.stop + 1), slow, t0, g)
        steady = {n: timed(lambda r=r: r.poll(time.time()))[0] for n, r in readers.items()}
        report = {
            "job": {
                "nodes": args.nodes,
                "ranks": args.nodes * args.ranks,
                "steps": args.steps,
                "groups": g,
            },
            "history_bytes": history_bytes,
            "per_agent": {
                n: {
                    "rank_files_read": len(next(iter(r._runs.values())).ranks),
                    "first_look_s": round(first[n], 4),
                    "read_and_judge_window_s": round(judged[n][0], 4),
                    "steady_poll_s": round(steady[n], 4),
                    "reported": [f.evidence.message for f in judged[n][1]],  # type: ignore[attr-defined]
                    "slowdown": round(r.slowdown(), 3),
                }
                for n, r in readers.items()
            },
        }
        print(json.dumps(report, indent=2))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
