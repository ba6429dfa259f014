"""Plot fault -> cordon latency against fleet size from docs/data/reaction.json.

The JSON holds what bench/reaction.py printed (one entry per run, with how the faults
came; with ``--repeat``, the medians, their spread and the floor measured beside them)
and NVSentinel's published figures; this draws p50 and p99 per kind of run on log axes,
against fleet size and against burst size (one line per fleet size, the floor dotted,
the spread of repeated runs as error bars), and writes docs/img/reaction-latency.png.
Run:

    .venv/bin/python bench/plot_reaction.py [--data docs/data/reaction.json] [--out FILE]
    .venv/bin/python bench/plot_reaction.py --since all   # every day's runs, not the last day's

Runs that say when they ran are drawn from the last day only (``--since``: that date and
later; the earlier ones stay in the JSON and in docs/controller.md): a day's runs compare
with each other, and every day's on one plot hid them.
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
    """Two panels: latency against fleet size (one line per way the faults came), and
    against the size of a burst (one line per fleet size with bursts of two sizes or
    more, the floor beside it)."""
    fig, (by_fleet, by_burst) = plt.subplots(1, 2, figsize=(13, 6.8))
    by_how: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in data["runs"]:
        by_how[series(run)].append(run)
    for how, runs in sorted(by_how.items()):
        runs.sort(key=lambda r: r["nodes"])
        nodes = [r["nodes"] for r in runs]
        line = by_fleet.plot(nodes, [r["p99_ms"] for r in runs], "o-", label=f"p99, {how}")
        by_fleet.plot(
            nodes, [r["p50_ms"] for r in runs], "s--", color=line[0].get_color(),
            label=f"p50, {how}",
        )  # fmt: skip
    ref = data["reference"]
    for q, marker in (("p99_ms", "^"), ("p50_ms", "v")):
        by_fleet.plot([ref["nodes"]], [ref[q]], marker, color="black", markersize=9,
                      label=f"{ref['name']} {q[:3]}")  # fmt: skip
    by_fleet.set_xscale("log")
    by_fleet.set_xlabel("nodes in the fleet (8 GPUs each)")
    by_fleet.set_title("against fleet size")
    by_fleet.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)

    bursts_by_fleet: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in data["runs"]:
        if r["how"] == f"burst of {r['faults']}":
            bursts_by_fleet[(r["nodes"], r.get("when", ""))].append(r)
    for (n, when), bursts in sorted(bursts_by_fleet.items()):
        nodes = f"{n:,} nodes" + (f", {when}" if when else "")
        if len(bursts) < 2:
            continue
        bursts.sort(key=lambda r: r["faults"])
        sizes = [r["faults"] for r in bursts]
        line = by_burst.errorbar(
            sizes, [r["p99_ms"] for r in bursts], yerr=spread(bursts, "p99_ms"), fmt="o-",
            capsize=3, label=f"p99, {nodes}",
        )  # fmt: skip
        color = line[0].get_color()
        by_burst.errorbar(
            sizes, [r["p50_ms"] for r in bursts], yerr=spread(bursts, "p50_ms"), fmt="s--",
            capsize=3, color=color, label=f"p50, {nodes}",
        )  # fmt: skip
        if all("floor_p99_ms" in r for r in bursts):
            by_burst.plot(sizes, [r["floor_p99_ms"] for r in bursts], "^:", color=color,
                          alpha=0.6, label=f"floor p99, {nodes}")  # fmt: skip
            by_burst.plot(sizes, [r["floor_p50_ms"] for r in bursts], "v:", color=color,
                          alpha=0.6, label=f"floor p50, {nodes}")  # fmt: skip
    largest = max(r["nodes"] for r in data["runs"])
    for r in data["runs"]:
        if r["nodes"] == largest and " over " in r["how"]:
            for q, marker in (("p99_ms", "^"), ("p50_ms", "v")):
                label = f"{q[:3]}, {r['how']}, {largest:,} nodes (not one burst)"
                by_burst.plot([r["faults"]], [r[q]], marker, color="grey", label=label)
    by_burst.set_xscale("log")
    by_burst.set_xlabel("faults in one burst (all written within a second)")
    by_burst.set_title("against burst size")
    by_burst.legend(fontsize=6, loc="lower right")
    for ax in (by_fleet, by_burst):
        ax.axhline(1000, color="grey", linewidth=0.8, linestyle=":")
        ax.axhline(200, color="grey", linewidth=0.8, linestyle="-.")
        ax.set_yscale("log")
        ax.set_ylabel("fault -> cordon (ms)")
        ax.grid(True, which="both", linewidth=0.3)
    by_fleet.text(3000, 1080, "goal: p99 <= 1 s, burst of 100 at 12,500 nodes", fontsize=7)
    by_fleet.text(3000, 215, "goal: p99 <= 200 ms, burst of 32 at 12,500 nodes", fontsize=7)
    fig.suptitle("Reaction time: gpufleet on 2 shared cores vs NVSentinel's published test")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def series(run: dict[str, Any]) -> str:
    """A run's line against fleet size: how the faults came, and when for runs that say
    (the same bench on another day and load is another line, not the same one)."""
    return run["how"] + (f", {run['when']}" if run.get("when") else "")


def spread(runs: list[dict[str, Any]], key: str) -> list[list[float]] | None:
    """Error bars from repeated runs' min-max (``spread``), none where a run has none."""
    if not all(key in r.get("spread", {}) for r in runs):
        return None
    return [
        [r[key] - r["spread"][key][0] for r in runs],
        [r["spread"][key][1] - r[key] for r in runs],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=ROOT / "docs/data/reaction.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/img/reaction-latency.png")
    parser.add_argument(
        "--since",
        default="",
        metavar="YYYY-MM-DD|all",
        help="draw runs that say when they ran from that day on (default: the last day)",
    )
    args = parser.parse_args()
    data = json.loads(args.data.read_text())
    plot({**data, "runs": since(data["runs"], args.since)}, args.out)


def since(runs: list[dict[str, Any]], day: str) -> list[dict[str, Any]]:
    """The runs to draw: those without a date, and the dated ones from ``day`` on (""
    the last date any run has, "all" every one). A date is the start of ``when``."""
    dated = [r["when"][:10] for r in runs if r.get("when")]
    if day == "all" or not dated:
        return runs
    first = day or max(dated)
    return [r for r in runs if not r.get("when") or r["when"][:10] >= first]


if __name__ == "__main__":
    main()
