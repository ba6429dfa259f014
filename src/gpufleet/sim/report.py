"""PNG report of a simulation: node availability timeline and loss waterfall.

Uses matplotlib's non-interactive Agg backend (no display needed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from gpufleet.sim.result import BUCKETS, RunResult

_COLORS = {
    "useful": "#2e7d32",
    "checkpoint": "#6d4c41",
    "detection": "#ef6c00",
    "isolation": "#c62828",
    "recovery": "#1565c0",
    "redone": "#6a1b9a",
    "degraded": "#9e9d24",
}


def waterfall(ax: Axes, fractions: Mapping[str, float], title: str) -> None:
    """Draw 100% of wall time falling, bucket by bucket, to the ETTR."""
    level = 1.0
    labels = ["wall time"]
    ax.bar(0, 1.0, color="#90a4ae")
    x = 1
    for name in BUCKETS[1:]:
        v = fractions.get(name, 0.0)
        ax.bar(x, v, bottom=level - v, color=_COLORS[name])
        ax.text(x, level + 0.002, f"-{v * 100:.2f}%", ha="center", va="bottom", fontsize=7)
        level -= v
        labels.append(name)
        x += 1
    ax.bar(x, level, color=_COLORS["useful"])
    ax.text(x, level + 0.002, f"{level * 100:.2f}%", ha="center", va="bottom", fontsize=8)
    labels.append("ETTR")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    low = max(0.0, level - 0.05)
    ax.set_ylim(low, 1.01)
    ax.set_ylabel("fraction of wall-clock time")
    ax.set_title(title, fontsize=9)


def timeline(ax: Axes, run: RunResult) -> None:
    """Nodes out of production over time, and when the job was not running."""
    tl = run.timeline
    t = tl["t_days"]
    ax.step(
        t, tl["out"], where="post", label="automation (drain/remediate/verify)", color="#ef6c00"
    )
    ax.step(t, tl["people"], where="post", label="people (triage/RMA/maintenance)", color="#6d4c41")
    total = run.job_nodes + run.spare_nodes
    short = [run.job_nodes - n for n in tl["job_nodes"]]
    ax.step(t, short, where="post", label="job nodes missing", color="#c62828", lw=0.8)
    down = [1 - r for r in tl["running"]]
    top = max([*tl["out"], *tl["people"], 1]) * 1.15
    ax.fill_between(
        t, 0, [d * top for d in down], step="post", color="#cfd8dc", label="job not running"
    )
    ax.set_xlabel("day")
    ax.set_ylabel("nodes")
    ax.set_ylim(0, top)
    ax.set_title(
        f"{total} nodes ({run.job_nodes} for the job, {run.spare_nodes} spare)", fontsize=9
    )
    ax.legend(fontsize=7, loc="upper right")


def write_report(path: str | Path, runs: Sequence[RunResult], title: str = "") -> None:
    """Timeline of the first run and the waterfall of the mean breakdown."""
    mean = {k: sum(r.fractions()[k] for r in runs) / len(runs) for k in BUCKETS}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    timeline(a1, runs[0])
    head = title or f"{runs[0].gpus} GPUs, {runs[0].days:g} days"
    waterfall(a2, mean, f"{head}: where the time went ({len(runs)} run(s))")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_comparison(
    path: str | Path, rows: Sequence[tuple[str, Mapping[str, float]]], title: str
) -> None:
    """Stacked bars of the loss breakdown for several scenarios."""
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [n for n, _ in rows]
    bottom = [0.0] * len(rows)
    for bucket in BUCKETS[1:]:
        vals = [f.get(bucket, 0.0) * 100 for _, f in rows]
        ax.barh(names, vals, left=bottom, color=_COLORS[bucket], label=bucket)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    for y, (_, f) in enumerate(rows):
        ax.text(bottom[y] + 0.2, y, f"ETTR {f['useful'] * 100:.1f}%", va="center", fontsize=8)
    ax.set_xlabel("% of wall-clock time lost")
    ax.set_xlim(0, max(bottom) * 1.3 + 0.5)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
