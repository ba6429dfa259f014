"""What a hot spare pool is worth: ETTR with 0, 1, 2 and 4% spares, printed as Markdown.

    .venv/bin/python bench/sim_spares.py --runs 40

Each row owns that many spare nodes beyond the job's (the model's ``fleet.sparePercent``)
and keeps them as hot spares (the policy's ``spares.percent``): the same domain code the
controller runs (gpufleet.domain.spares) decides who waits and who is promoted. Rows for the
default stack and for the stack with fast recovery and SDC found within an hour (the
changes docs/sim-comparison.md finds necessary for 98.5%). Seeds 1..runs; 95% CI of the
mean. Asserts nothing.
"""

from __future__ import annotations

import argparse

from gpufleet.domain.policy import default_policy
from gpufleet.sim import simulate, summarize
from gpufleet.sim.model import default_model
from gpufleet.sim.result import RunResult
from gpufleet.sim.scenarios import with_overrides

FAST = {
    "job.checkpoint.blocking_seconds": 1.0,
    "job.restart_seconds": 105.0,
    "job.requeue_seconds": 15.0,
    "detection.passive_seconds": 10.0,
    "failures.categories.sdc.symptom_mean_seconds": 3600.0,
}


def runs(percent: float, fast: bool, gpus: int, days: float, n: int) -> list[RunResult]:
    model = with_overrides(
        default_model(), {"fleet.spare_percent": percent, **(FAST if fast else {})}
    )
    spares = default_policy().spares.model_copy(update={"percent": percent})
    policy = default_policy().model_copy(update={"spares": spares})
    return [simulate(model, policy, gpus=gpus, days=days, seed=s) for s in range(1, n + 1)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--gpus", type=int, default=3504)
    args = ap.parse_args()
    print(f"{args.gpus} GPUs, {args.days:g} days, seeds 1-{args.runs}\n")
    print("| stack | spares | hot spares (end) | promotions | ETTR % (95% CI) | waiting % |")
    print("|---|---|---|---|---|---|")
    for fast in (False, True):
        for percent in (0.0, 1.0, 2.0, 4.0):
            rs = runs(percent, fast, args.gpus, args.days, args.runs)
            s = summarize(rs)
            e = s["ettr"]
            wait = sum(r.waiting_hours * 3600 / r.wall for r in rs) / len(rs) * 100
            hot = sum(r.hot_spares for r in rs) / len(rs)
            promo = sum(r.spare_promotions for r in rs) / len(rs)
            stack = "default + fast recovery + SDC in 1 h" if fast else "default"
            spare = f"{percent:g}% ({rs[0].spare_nodes} nodes)"
            ci = f"{e['mean'] * 100:.2f} ({e['low'] * 100:.2f}-{e['high'] * 100:.2f})"
            print(
                f"| {stack} | {spare} | {hot:.1f} | {promo:.1f} | {ci} | {wait:.2f} |", flush=True
            )


if __name__ == "__main__":
    main()
