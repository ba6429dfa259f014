"""What a simulation reports: ETTR, where the time went, incidents, availability.

The job's wall-clock time is split into buckets that add up to the whole. Beside
``useful`` and ``checkpoint`` they are the goodput ledger's categories
(:mod:`gpufleet.domain.goodput`, docs/goodput.md), in whole-job seconds:

* ``useful`` — training progress that was kept (ETTR = useful / wall time);
* ``checkpoint`` — training stalled by checkpoint saves (the ledger counts a save as
  a slow, productive step);
* ``detection`` — the job (or a replica group) was dead or hung and nobody knew yet
  (including a person searching for the bad node when no monitor named it);
* ``isolation`` — reported, the node not yet out of the job (a replica group's
  departure; a stopped job is out at once);
* ``recovery`` — requeue, initialisation and checkpoint load, waiting for enough
  healthy nodes to start (``waiting_hours`` of it), a replacement group rejoining;
* ``redone`` — work computed again: after the last good checkpoint, an SDC rollback,
  the step the surviving replica groups lose;
* ``degraded`` — running slower than full speed: a straggler in the job, the job
  shrunk to fewer nodes, a replica group missing with no replacement.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

BUCKETS: tuple[str, ...] = (
    "useful",
    "checkpoint",
    "detection",
    "isolation",
    "recovery",
    "redone",
    "degraded",
)

_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def t95(df: int) -> float:
    """Two-sided 95% Student t quantile (conservative between table entries)."""
    if df <= 0:
        return math.inf
    keys = [k for k in sorted(_T95) if k <= df]
    return _T95[keys[-1]] if df <= 30 else 1.96


@dataclass(frozen=True, slots=True)
class RunResult:
    """One simulated run."""

    gpus: int
    job_nodes: int
    spare_nodes: int
    days: float
    seed: int
    checkpoint_interval_seconds: float
    buckets: dict[str, float]
    """Seconds of job wall-clock time per bucket (they sum to the horizon)."""
    incidents: dict[str, int]
    """Faults that started, per category (on any node, in the job or not)."""
    job_incidents: dict[str, int]
    """Faults that started on a node of the job, per category."""
    interruptions: dict[str, int]
    """Times the job stopped, per cause (``planned``; ``repeat``: again on an unrepaired node)."""
    handled: dict[str, dict[str, int]]
    """Per category: what ended each fault (job-restart, a ladder step, person, rma, open)."""
    planned: int
    lemons: int
    """Lemon nodes the fleet had (at the start)."""
    lemons_replaced: int
    """Of them, replaced (RMA) during the run."""
    replaced: int
    """Nodes whose hardware was replaced."""
    sdc_rollback_hours: float
    """Of the redone work, how much was kept and then discarded because of SDC."""
    decisions: int
    held: int
    """Decisions a safety rail held back (retried later)."""
    human_actions: int
    timeline: dict[str, list[float]] = field(repr=False)
    hot_spares: int = 0
    """Hot spares in the pool at the end (the policy's ``spares``; domain.spares)."""
    spare_promotions: int = 0
    """Times a hot spare was promoted because a node left production."""
    waiting_hours: float = 0.0
    """Of ``recovery``, the hours the job waited for enough healthy nodes to start."""

    @property
    def wall(self) -> float:
        """Seconds accounted (the horizon)."""
        return sum(self.buckets.values())

    @property
    def ettr(self) -> float:
        """Effective training time ratio: kept progress over wall-clock time."""
        wall = self.wall
        return self.buckets["useful"] / wall if wall > 0 else 0.0

    def fractions(self) -> dict[str, float]:
        """Each bucket as a fraction of wall-clock time."""
        wall = self.wall or 1.0
        return {k: v / wall for k, v in self.buckets.items()}

    @property
    def availability(self) -> float:
        """Mean fraction of the fleet's nodes in production (from the timeline samples)."""
        prod = self.timeline.get("production", [])
        nodes = self.job_nodes + self.spare_nodes
        return sum(prod) / (len(prod) * nodes) if prod and nodes else 0.0

    def to_dict(self, *, timeline: bool = True) -> dict[str, Any]:
        """Plain data for JSON output (the timeline: node counts sampled over time)."""
        data = asdict(self)
        if not timeline:
            data.pop("timeline")
        data["availability"] = self.availability
        data["ettr"] = self.ettr
        data["breakdown"] = self.fractions()
        data["buckets_hours"] = {k: v / 3600.0 for k, v in data.pop("buckets").items()}
        data["interruptions_total"] = sum(self.interruptions.values())
        return data


@dataclass(frozen=True, slots=True)
class Estimate:
    """Mean of several runs with a 95% confidence interval (Student t)."""

    mean: float
    low: float
    high: float
    stdev: float
    runs: int

    @classmethod
    def of(cls, values: list[float]) -> Estimate:
        """The estimate from per-run values."""
        n = len(values)
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if n > 1 else 0.0
        half = t95(n - 1) * sd / math.sqrt(n) if n > 1 else 0.0
        return cls(mean=mean, low=mean - half, high=mean + half, stdev=sd, runs=n)


def summarize(runs: list[RunResult]) -> dict[str, Any]:
    """Mean and confidence interval over runs of the same configuration."""
    first = runs[0]
    ettr = Estimate.of([r.ettr for r in runs])
    breakdown = {k: asdict(Estimate.of([r.fractions()[k] for r in runs])) for k in BUCKETS}
    inter = Estimate.of([float(sum(r.interruptions.values())) for r in runs])
    return {
        "gpus": first.gpus,
        "job_nodes": first.job_nodes,
        "spare_nodes": first.spare_nodes,
        "days": first.days,
        "runs": len(runs),
        "seeds": [r.seed for r in runs],
        "checkpoint_interval_seconds": first.checkpoint_interval_seconds,
        "ettr": asdict(ettr),
        "breakdown": breakdown,
        "interruptions_total": asdict(inter),
    }
