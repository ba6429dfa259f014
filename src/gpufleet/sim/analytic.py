"""Closed-form checkpoint and goodput formulas the simulator is checked against.

Notation of docs/simulator.md: C blocking checkpoint cost, tau checkpoint
interval, M the job's mean time between failures, D detection time, R restart
time (requeue + init + load). All in seconds.
"""

from __future__ import annotations

import math

from gpufleet.sim.model import Effect, Model


def young_interval(cost: float, mtbf: float) -> float:
    """Young (1974): tau = sqrt(2 C M)."""
    return math.sqrt(2.0 * cost * mtbf)


def daly_interval(cost: float, mtbf: float) -> float:
    """Daly (2006) higher-order optimum; M when C >= 2M.

    Reproduces Daly's worked examples (C = 5 min: M = 24 h -> 116.7 min,
    M = 6 h -> 56.7 min, M = 15 min -> 9.14 min).
    """
    if cost <= 0:
        return 1.0
    if cost >= 2.0 * mtbf:
        return mtbf
    x = cost / (2.0 * mtbf)
    return math.sqrt(2.0 * cost * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost


def first_order_ettr(
    *, cost: float, interval: float, detect: float, restart: float, mtbf: float
) -> float:
    """ETTR ~ 1 - C/tau - (D + R + tau/2)/M (reliability-data section 5.1)."""
    return 1.0 - cost / interval - (detect + restart + interval / 2.0) / mtbf


def job_mtbf(model: Model, job_nodes: int) -> float:
    """Expected seconds between job-killing failures (crash, hang, SDC) of a job."""
    rate = (
        sum(c.rate for c in model.failures.categories if c.effect is not Effect.SLOW)
        / 1000.0
        / 86400.0
    )
    return math.inf if rate <= 0 else 1.0 / (rate * job_nodes)


def checkpoint_interval(model: Model, job_nodes: int) -> float:
    """The interval the simulator uses: the model's, or Daly's optimum."""
    ck = model.job.checkpoint
    if ck.interval_seconds is not None:
        return ck.interval_seconds
    mtbf = job_mtbf(model, job_nodes)
    if math.isinf(mtbf):
        return 86400.0
    return max(1.0, daly_interval(ck.blocking_seconds, mtbf))
