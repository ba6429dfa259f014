"""The example training job (``examples/slurm-ddp``): submit it, measure what a fault cost.

The job writes its own log (``events.jsonl``: start with the step it resumed
from, every step, done), so work lost and goodput are measured from what the
job did, not from what the demo expected.
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.local.cluster import ClusterInfo

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "slurm-ddp"


@dataclass(frozen=True)
class JobShape:
    steps: int = 40
    every: int = 5
    step_time_s: float = 0.5


def submit(
    info: ClusterInfo,
    ckpt: Path,
    shape: JobShape,
    *extra: str,
    env: dict[str, str] | None = None,
) -> int:
    """``sbatch examples/slurm-ddp/train.sbatch`` (2 nodes, requeue-able); the job id.

    ``env`` is added to the job's environment (telemetry and simulated-GPU paths).
    """
    ckpt.mkdir(parents=True, exist_ok=True)
    env = {
        **(env or {}),
        "CKPT_DIR": str(ckpt),
        "TRAIN_PY": str(EXAMPLE / "train.py"),
        "STEPS": str(shape.steps),
        "EVERY": str(shape.every),
        "STEP_TIME": str(shape.step_time_s),
    }
    return sbatch(info, EXAMPLE / "train.sbatch", ckpt, env, *extra)


def sbatch(
    info: ClusterInfo, script: Path, output_dir: Path, env: dict[str, str], *extra: str
) -> int:
    """``sbatch script`` with ``env`` added to the cluster's (and this Python as ``PYTHON``),
    its output in ``output_dir/slurm-<id>.out``; the job id."""
    out = subprocess.run(
        ["sbatch", "--parsable", f"--output={output_dir}/slurm-%j.out", *extra, str(script)],
        env={**info.slurm_env(), "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0:
        raise RuntimeError(f"sbatch failed: {out.stderr.strip()}")
    return int(out.stdout.strip().split(";")[0])


def cancel_all(info: ClusterInfo) -> None:
    subprocess.run(
        ["scancel", "--user=root"], env=info.slurm_env(), capture_output=True, timeout=30
    )


@dataclass(frozen=True)
class WorkReport:
    steps: int
    steps_run: int
    repeated: int
    step_s: float
    elapsed_s: float
    stalled_s: float
    goodput: float
    restarts: int
    resumed_at: int | None

    @property
    def lost_s(self) -> float:
        """Repeated steps plus the time no step ran (detection, requeue, restart)."""
        return self.repeated * self.step_s + self.stalled_s


def work_report(events: list[dict[str, Any]], steps: int) -> WorkReport | None:
    """What the job did: steps run and repeated, time stalled, goodput. None if not done."""
    done = [e for e in events if e["kind"] == "done"]
    starts = [e for e in events if e["kind"] == "start"]
    step_events = [e for e in events if e["kind"] == "step"]
    if not done or not starts or not step_events:
        return None
    step_s = _median_step(step_events) or 0.0
    elapsed = done[-1]["t"] - starts[0]["t"]
    useful = steps * step_s
    # Time between the last step of one run and the first step of the next.
    stalled = 0.0
    for a, b in itertools.pairwise(step_events):
        if a.get("restart") != b.get("restart"):
            stalled += max(0.0, b["t"] - a["t"] - step_s)
    return WorkReport(
        steps=steps,
        steps_run=len(step_events),
        repeated=len(step_events) - len({e["step"] for e in step_events}),
        step_s=step_s,
        elapsed_s=elapsed,
        stalled_s=stalled,
        goodput=useful / elapsed if elapsed > 0 else 0.0,
        restarts=len(starts) - 1,
        resumed_at=int(starts[-1]["step"]) if len(starts) > 1 else None,
    )


def pace(events: list[dict[str, Any]], start: float, end: float) -> float | None:
    """Median seconds per step of the steps the job finished between ``start`` and ``end``."""
    return _median_step([e for e in events if e["kind"] == "step" and start <= e["t"] <= end])


def _median_step(step_events: list[dict[str, Any]]) -> float | None:
    """Median time between consecutive steps of one run (None: no two such steps)."""
    gaps = [
        b["t"] - a["t"]
        for a, b in itertools.pairwise(step_events)
        if a.get("restart") == b.get("restart") and b["step"] == a["step"] + 1
    ]
    return statistics.median(gaps) if gaps else None
