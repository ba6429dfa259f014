"""Helpers for simulator tests: small models built from the default one."""

from __future__ import annotations

from typing import Any

from gpufleet.sim.model import Model, default_model
from gpufleet.sim.scenarios import with_overrides


def analytic_model(
    *, rate: float, effect: str, cost: float, interval: float, detect: float, restart: float
) -> Model:
    """One exponential failure category, fixed costs, no health checks, ample spares.

    ``rate`` is per 1000 node-days. Crashes are cured by a GPU reset so every
    failure goes through the policy (isolate, drain, reset, verify, return).
    """
    base = default_model()
    data: dict[str, Any] = base.model_dump()
    crash = {
        "name": "only",
        "rate": rate,
        "effect": effect,
        "scope": "gpu",
        "lemon": False,
    }
    if effect == "crash":
        crash.update(xid=48, cure={"gpu-reset": 1.0})
    else:
        crash.update(cure={"restart-job": 1.0})
    data["failures"] = {
        "categories": [crash],
        "planned": {"rate": 0.0},
        "lemons": {"fraction": 0.0, "spread": 0.0},
    }
    model = Model.model_validate(data)
    return with_overrides(
        model,
        {
            "fleet.spare_nodes": 8,
            "job.min_fraction": 1.0,
            "job.checkpoint.interval_seconds": interval,
            "job.checkpoint.blocking_seconds": cost,
            "job.restart_seconds": restart,
            "job.requeue_seconds": 0.0,
            "detection.passive_seconds": detect,
            "detection.hang_timeout_seconds": detect,
            "detection.active_checks.enabled": False,
            "detection.performance_monitoring": False,
            "remediation.steps": {
                "gpu-reset": {"seconds": 300, "success": 1.0},
                "reboot": {"seconds": 600, "success": 1.0},
                "power-cycle": {"seconds": 900, "success": 1.0},
                "reimage": {"seconds": 2400, "success": 1.0},
            },
        },
    )
