"""Plot fault -> cordon latency against fleet size from docs/data/reaction.json.

The JSON holds what bench/reaction.py printed (one entry per run, with how the faults
came) and NVSentinel's published figures; this draws p50 and p99 per kind of run on
log axes and writes docs/img/reaction-latency.png. Run:

    .venv/bin/python bench/plot_reaction.py [--data docs/data/reaction.json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]


def plot(data: dict[str, Any], out: Path) -> None:
    by_how: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in data["runs"]:
        by_how[run["how"]].append(run)
    fig, ax = plt.subplots(figsize=(10.5, 5))
    for how, runs in sorted(by_how.items()):
        runs.sort(key=lambda r: r["nodes"])
        nodes = [r["nodes"] for r in runs]
        line = ax.plot(nodes, [r["p99_ms"] for r in runs], "o-", label=f"gpufleet p99, {how}")
        ax.plot(
            nodes, [r["p50_ms"] for r in runs], "s--", color=line[0].get_color(),
            label=f"gpufleet p50, {how}",
        )  # fmt: skip
    ref = data["reference"]
    for q, marker in (("p99_ms", "^"), ("p50_ms", "v")):
        ax.plot([ref["nodes"]], [ref[q]], marker, color="black", markersize=9,
                label=f"{ref['name']} {q[:3]}")  # fmt: skip
    ax.axhline(1000, color="grey", linewidth=0.8, linestyle=":")
    ax.text(250, 1050, "goal: p99 <= 1 s for a burst of 32 at 12,500 nodes", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes in the fleet (8 GPUs each)")
    ax.set_ylabel("fault -> cordon (ms)")
    ax.set_title("Reaction time: gpufleet on 2 shared cores vs NVSentinel's published test")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, which="both", linewidth=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT / "docs/data/reaction.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/img/reaction-latency.png")
    args = parser.parse_args()
    plot(json.loads(args.data.read_text()), args.out)


if __name__ == "__main__":
    main()
