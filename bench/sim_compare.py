"""The comparison in docs/sim-comparison.md: prints its tables, redraws its plots.

    .venv/bin/python bench/sim_compare.py [--runs 10] [--days 30]

Scenarios are in gpufleet.sim.scenarios; every run uses seeds 1..runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufleet.sim import simulate, summarize
from gpufleet.sim.model import Model
from gpufleet.sim.report import write_comparison, write_report
from gpufleet.sim.result import BUCKETS, RunResult
from gpufleet.sim.scenarios import (
    FULL,
    NO_LEMON_POLICY_YAML,
    SCENARIOS,
    Scenario,
    lemon_policy_yaml,
    with_overrides,
)

IMG = Path(__file__).resolve().parent.parent / "docs" / "img"

SWEEP: list[tuple[str, dict[str, object]]] = [
    ("full (default model and policy)", {}),
    ("+ 1 s blocking checkpoint (in-memory)", {"job.checkpoint.blocking_seconds": 1.0}),
    ("+ restart 5 min -> 2 min", {"job.restart_seconds": 105.0, "job.requeue_seconds": 15.0}),
    ("+ detection 30 s -> 10 s", {"detection.passive_seconds": 10.0}),
    ("+ hang watchdog 10 min -> 1 min", {"detection.hang_timeout_seconds": 60.0}),
    (
        "+ loss-spike monitoring finds SDC within 1 h",
        {"failures.categories.sdc.symptom_mean_seconds": 3600.0},
    ),
    ("+ 2% spares", {"fleet.spare_percent": 2.0}),
]


def runs_of(model: Model, scenario: Scenario, gpus: int, days: float, n: int) -> list[RunResult]:
    policy = scenario.policy()
    return [simulate(model, policy, gpus=gpus, days=days, seed=s) for s in range(1, n + 1)]


def row(name: str, runs: list[RunResult]) -> str:
    s = summarize(runs)
    e = s["ettr"]
    cells = [f"{s['breakdown'][k]['mean'] * 100:.2f}" for k in BUCKETS[1:]]
    inter = s["interruptions_total"]["mean"]
    ci = f"{e['mean'] * 100:.2f} ({e['low'] * 100:.2f}-{e['high'] * 100:.2f})"
    return f"| {name} | {ci} | " + " | ".join(cells) + f" | {inter:.0f} |"


def header(first: str) -> str:
    cols = ["ETTR % (95% CI)", *[f"{k} %" for k in BUCKETS[1:]], "interruptions"]
    return f"| {first} | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--days", type=float, default=30.0)
    args = ap.parse_args()
    IMG.mkdir(parents=True, exist_ok=True)
    for gpus in (3504, 16384):
        print(f"\n### {gpus} GPUs, {args.days:g} days, {args.runs} runs\n")
        print(header("scenario"))
        bars = []
        for sc in SCENARIOS:
            runs = runs_of(sc.model(), sc, gpus, args.days, args.runs)
            print(row(sc.name, runs))
            mean = {k: sum(r.fractions()[k] for r in runs) / len(runs) for k in BUCKETS}
            bars.append((sc.name, mean))
            if sc is FULL:
                write_report(IMG / f"sim-full-{gpus}.png", runs, f"full, {gpus} GPUs")
        write_comparison(
            IMG / f"sim-compare-{gpus}.png",
            bars,
            f"{gpus} GPUs, {args.days:g} days: where the time goes ({args.runs} runs each)",
        )
    print("\n### What it takes: 3504 GPUs, cumulative changes to the full scenario\n")
    print(header("change"))
    overrides: dict[str, object] = {}
    base = FULL.model()
    for name, more in SWEEP:
        overrides.update(more)
        runs = runs_of(with_overrides(base, overrides), FULL, 3504, args.days, args.runs)
        print(row(name, runs))
    print("\n### Lemon rule: 16384 GPUs, full scenario\n")
    print(header("lemon rule"))
    rules = [
        ("default: score 2.5 (GPU 2.0), half-life 14 days", FULL),
        (
            "strict: score 1.5 (GPU 1.5), half-life 28 days",
            Scenario("lemon-strict", "", {}, LEMON_STRICT_POLICY_YAML),
        ),
        ("off", Scenario("no-lemon", "", {}, NO_LEMON_POLICY_YAML)),
    ]
    for name, sc in rules:
        runs = runs_of(base, sc, 16384, args.days, args.runs)
        replaced = sum(r.lemons_replaced for r in runs) / len(runs)
        lemons = sum(r.lemons for r in runs) / len(runs)
        print(row(f"{name} (lemons replaced {replaced:.1f} of {lemons:.1f})", runs))


LEMON_STRICT_POLICY_YAML = lemon_policy_yaml(1.5, 1.5, 28)


if __name__ == "__main__":
    main()
