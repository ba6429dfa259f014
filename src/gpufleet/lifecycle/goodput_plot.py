"""PNG of the goodput ledger: where each training's GPU-seconds went, and each incident's cost.

matplotlib's non-interactive Agg backend (no display needed), as the simulator's report.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gpufleet.domain.goodput import CATEGORIES, Ledger

COLORS = {
    "productive": "#2e7d32",
    "detection": "#ef6c00",
    "isolation": "#c62828",
    "recovery": "#1565c0",
    "redone": "#6a1b9a",
    "degraded": "#9e9d24",
}


def write_plot(path: str | Path, led: Ledger, title: str = "") -> None:
    """Left: each training's allocation as stacked GPU-hours (productive, then each
    category). Right: each incident's lost GPU-hours by category."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    names = [t.training for t in led.trainings] or ["(no training)"]
    left = [0.0] * len(led.trainings)
    for key in ("productive", *CATEGORIES):
        vals = [
            (t.productive if key == "productive" else t.lost[key]) / 3600 for t in led.trainings
        ]
        if led.trainings:
            a1.barh(names, vals, left=left, color=COLORS[key], label=key)
            left = [x + v for x, v in zip(left, vals, strict=True)]
    for y, t in enumerate(led.trainings):
        a1.text(left[y], y, f" goodput {t.goodput * 100:.2f}%", va="center", fontsize=8)
    a1.set_xlim(0, max(left, default=0.0) * 1.25 or 1.0)
    a1.set_xlabel("GPU-hours allocated")
    a1.invert_yaxis()
    a1.legend(fontsize=7, loc="lower right")
    a1.set_title(title or "trainings: where the GPU-hours went", fontsize=9)
    rows = [r for r in led.incidents if r.total > 0]
    labels = [f"{r.incident.node} {r.incident.fault}" for r in rows] or ["(no incident cost)"]
    left = [0.0] * len(rows)
    for key in CATEGORIES:
        vals = [r.lost[key] / 3600 for r in rows]
        if rows:
            a2.barh(labels, vals, left=left, color=COLORS[key], label=key)
            left = [x + v for x, v in zip(left, vals, strict=True)]
    a2.set_xlabel("GPU-hours lost")
    a2.invert_yaxis()
    a2.set_title("incidents: what each cost", fontsize=9)
    if rows:
        a2.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
