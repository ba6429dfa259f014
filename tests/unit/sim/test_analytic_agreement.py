"""The simulator against the first-order model ETTR ~ 1 - C/tau - (D + R + tau/2)/M.

With exponential failures, fixed costs and no health checks, the simulated
ETTR must match the formula within sampling error. The tolerance is computed,
not guessed: 4 standard errors of the mean over the runs (from the sample
standard deviation), plus the formula's own neglected second-order terms,
bounded by L^2 where L is its first-order loss. Parameter sets keep L <= 6%,
so that bound (<= 0.36 points) is well below what a missing or doubled cost
term would move the result (>= 1 point).
"""

from __future__ import annotations

import math
import statistics

import pytest

from gpufleet.domain.policy import default_policy
from gpufleet.sim import simulate
from gpufleet.sim.analytic import daly_interval, first_order_ettr, young_interval

from .models import analytic_model

RUNS = 8
DAYS = 40

SETS = [
    # nodes, job MTBF (h), effect, C, tau, D, R
    pytest.param(32, 8.0, "crash", 30.0, 1800.0, 30.0, 300.0, id="crash-hourly-ish"),
    pytest.param(16, 16.0, "hang", 20.0, 900.0, 600.0, 300.0, id="hang-watchdog"),
    pytest.param(64, 12.0, "crash", 10.0, 600.0, 30.0, 120.0, id="crash-fast"),
]


@pytest.mark.parametrize(("nodes", "mtbf_h", "effect", "cost", "tau", "detect", "restart"), SETS)
def test_simulated_ettr_matches_first_order_formula(
    nodes: int, mtbf_h: float, effect: str, cost: float, tau: float, detect: float, restart: float
) -> None:
    mtbf = mtbf_h * 3600.0
    rate = 1000.0 * 86400.0 / (nodes * mtbf)  # per 1000 node-days, so the job's MTBF is M
    model = analytic_model(
        rate=rate, effect=effect, cost=cost, interval=tau, detect=detect, restart=restart
    )
    runs = [
        simulate(model, default_policy(), gpus=nodes * 8, days=DAYS, seed=s) for s in range(RUNS)
    ]
    assert all(r.waiting_hours == 0.0 for r in runs), "spares must absorb every repair"
    assert sum(sum(r.interruptions.values()) for r in runs) > 300, "too few failures to test"

    ettrs = [r.ettr for r in runs]
    mean = statistics.fmean(ettrs)
    se = statistics.stdev(ettrs) / math.sqrt(RUNS)
    expected = first_order_ettr(cost=cost, interval=tau, detect=detect, restart=restart, mtbf=mtbf)
    loss = 1.0 - expected
    assert loss <= 0.06
    assert abs(mean - expected) <= 4 * se + loss**2, (mean, expected, se)


def test_every_failure_costs_detection_and_restart_time() -> None:
    """The breakdown, not only the total, agrees: per failure, D in detection, R in restart."""
    model = analytic_model(
        rate=1000.0 * 86400.0 / (32 * 8 * 3600.0),
        effect="crash",
        cost=30.0,
        interval=1800.0,
        detect=45.0,
        restart=240.0,
    )
    r = simulate(model, default_policy(), gpus=256, days=20, seed=3)
    failures = sum(r.interruptions.values())
    assert failures > 30
    # A failure during a restart restarts it, so restart time is at least R per failure.
    assert r.buckets["detection"] == pytest.approx(45.0 * failures, rel=0.02)
    assert r.buckets["recovery"] >= 240.0 * failures * 0.99


def test_daly_interval_reproduces_the_published_examples() -> None:
    five = 300.0
    assert daly_interval(five, 24 * 3600) / 60 == pytest.approx(116.7, abs=0.1)
    assert daly_interval(five, 6 * 3600) / 60 == pytest.approx(56.7, abs=0.1)
    assert daly_interval(five, 15 * 60) / 60 == pytest.approx(9.14, abs=0.02)
    assert young_interval(five, 24 * 3600) == pytest.approx(math.sqrt(2 * 300 * 86400))
