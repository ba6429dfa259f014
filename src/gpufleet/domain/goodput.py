"""The goodput ledger: every GPU-second a training lost, charged to one incident and one category.

A training's *allocation* is its ranks (one GPU each) times the time from its first
step to its last. Each second of each rank is either **productive** (a step that the
training kept) or lost, and a lost second is charged once, to the incident that caused
it (or to none) and to one category:

* ``detection`` — the rank stopped making progress and gpufleet had not yet reported
  the fault (from the rank's last step before the gap to the incident's report);
* ``isolation`` — reported, but the node was not yet out of the job (the group had not
  departed, the job was not yet requeued);
* ``recovery`` — the node was out and the rank's capacity was not back yet: the
  replacement group had not rejoined, the requeued job was not training again;
* ``redone`` — steps computed a second time (after a reload from a checkpoint);
* ``degraded`` — the training ran without this rank and nothing was bringing it back:
  a group that never rejoined (until the training's end), a rank that started late,
  a gap no incident explains.

The invariant (a test): productive + the five categories = allocated, per training.

**Inputs.** Progress is the job telemetry (:mod:`gpufleet.domain.stragglers`: one line
per rank per step, ``<job>.<run>/rank-<rank>.<node>.jsonl``); a training is one
``<job>`` over all its runs (a requeued job is run 1, 2, ... of the same training;
replica groups share ``<job>`` and run 0). Incidents are NodeRemediation records
(:func:`incident_of`): *reported* is the incident's ``startedAt``; *out* is when its
first step began (the node had been emptied: a requeue, a reset, a reboot all start
on an empty node); *back* is ``completedAt``. When the fault *began* is the job's own
evidence: the rank's last step before the gap.

**Gaps.** A rank's step normally takes about the training's median step time. An
interval between two of its records longer than ``gap_factor`` times that median is a
gap: the last median of it is the step being computed (productive or redone), the rest
is lost. A gap is charged to an incident on the node the rank ran on before the gap
(whose window overlaps it), else to an incident on any node of the training (the
survivors' stalled collective), else to no incident (``degraded``). Overlapping
incidents never charge a second twice: each gap goes to exactly one incident, the
first reported.

Pure: no clock, no files (decision 0276).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.domain.stragglers import parse_sample

CATEGORIES: tuple[str, ...] = ("detection", "isolation", "recovery", "redone", "degraded")
"""Where lost GPU-seconds go (the simulator reports the same names)."""

GAP_FACTOR = 3.0
"""An interval longer than this many median steps is a gap (a checkpoint save or a
slow step stays productive)."""

LOOKBACK_SECONDS = 3600.0
"""A gap may begin this long before its incident was reported (detection time)."""


@dataclass(frozen=True, slots=True)
class Progress:
    """One rank's report of one step (one telemetry line)."""

    training: str
    rank: int
    node: str
    step: int
    at: float
    group: str = ""
    """The replica group's id ("" for a job without groups)."""


@dataclass(frozen=True, slots=True)
class Incident:
    """One incident on one node, with the times the ledger splits a gap at."""

    name: str
    node: str
    fault: str
    reported: float
    out: float | None = None
    """When the node was out of the job; None: not yet (still isolating)."""
    back: float | None = None
    """When the incident ended; None: open."""
    began: float | None = None
    """When the fault began, if something knows (else the job's evidence decides)."""

    @property
    def closed(self) -> bool:
        return self.back is not None


def _zero() -> dict[str, float]:
    return dict.fromkeys(CATEGORIES, 0.0)


@dataclass(slots=True)
class Charges:
    """GPU-seconds per category."""

    seconds: dict[str, float] = field(default_factory=_zero)

    def add(self, category: str, gpu_seconds: float) -> None:
        if gpu_seconds > 0:
            self.seconds[category] += gpu_seconds

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


@dataclass(frozen=True, slots=True)
class TrainingLedger:
    """One training's allocation, productive time and losses."""

    training: str
    ranks: int
    groups: int
    start: float
    end: float
    step_seconds: float
    productive: float
    lost: dict[str, float]
    by_incident: dict[str, dict[str, float]]
    """Lost GPU-seconds per incident name ("" = no incident) and category."""

    @property
    def allocated(self) -> float:
        return self.ranks * (self.end - self.start)

    @property
    def goodput(self) -> float:
        """Productive over allocated GPU-seconds."""
        return self.productive / self.allocated if self.allocated > 0 else 0.0


@dataclass(frozen=True, slots=True)
class IncidentLedger:
    """What one incident cost, over every training it touched."""

    incident: Incident
    lost: dict[str, float]
    trainings: tuple[str, ...]

    @property
    def total(self) -> float:
        return sum(self.lost.values())


@dataclass(frozen=True, slots=True)
class Ledger:
    """Per training, per incident, and fleet-wide sums."""

    trainings: tuple[TrainingLedger, ...]
    incidents: tuple[IncidentLedger, ...]

    @property
    def allocated(self) -> float:
        return sum(t.allocated for t in self.trainings)

    @property
    def productive(self) -> float:
        return sum(t.productive for t in self.trainings)

    @property
    def lost(self) -> dict[str, float]:
        out = _zero()
        for t in self.trainings:
            for k, v in t.lost.items():
                out[k] += v
        return out

    @property
    def goodput(self) -> float:
        return self.productive / self.allocated if self.allocated > 0 else 0.0


# ------------------------------------------------------------------ inputs


def progress_of(line: str) -> Progress | None:
    """A telemetry line as progress, or None (the one place the ledger reads a line:
    through the telemetry codec, :func:`gpufleet.domain.stragglers.parse_sample`)."""
    sample = parse_sample(line)
    if sample is None:
        return None
    return Progress(
        sample.job, sample.rank, sample.node, sample.step, sample.at, sample.group or ""
    )


def _time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def incident_of(doc: Mapping[str, Any]) -> Incident | None:
    """A NodeRemediation object as an incident, or None when it has no start time."""
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    status = doc.get("status") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    if not isinstance(status, Mapping):
        return None
    reported = _time(status.get("startedAt"))
    node = spec.get("node")
    if reported is None or not isinstance(node, str) or not node:
        return None
    steps = status.get("steps") or []
    firsts = [
        t for s in steps if isinstance(s, Mapping) and (t := _time(s.get("startedAt"))) is not None
    ]
    back = _time(status.get("completedAt"))
    out = min(firsts) if firsts else back
    return Incident(
        name=str(meta.get("name", "")),
        node=node,
        fault=str(spec.get("fault", "")),
        reported=reported,
        out=max(out, reported) if out is not None else None,
        back=back,
    )


# ------------------------------------------------------------------ ledger


@dataclass(slots=True)
class _Book:
    """Charges of one training, per incident name."""

    per: dict[str, Charges] = field(default_factory=dict)

    def charge(self, incident: str, category: str, gpu_seconds: float) -> None:
        self.per.setdefault(incident, Charges()).add(category, gpu_seconds)


def _window(i: Incident) -> tuple[float, float]:
    begin = i.began if i.began is not None else i.reported - LOOKBACK_SECONDS
    return begin, i.back if i.back is not None else math.inf


def _culprit(
    node: str, nodes: set[str], a: float, b: float, incidents: Sequence[Incident]
) -> Incident | None:
    """The incident a gap [a, b] is charged to: on the rank's node, else on the training's."""

    def overlapping(pool: Iterable[Incident]) -> list[Incident]:
        return [i for i in pool if _window(i)[0] <= b and _window(i)[1] >= a]

    for pool in (
        (i for i in incidents if i.node == node),
        (i for i in incidents if i.node in nodes),
    ):
        hits = overlapping(pool)
        if hits:
            return min(hits, key=lambda i: (i.reported, i.name))
    return None


def _split_gap(
    book: _Book, incident: Incident | None, a: float, b: float, *, came_back: bool
) -> None:
    """Charge one rank's lost interval [a, b] (one GPU)."""
    if b <= a:
        return
    if incident is None:
        book.charge("", "degraded", b - a)
        return
    reported = incident.reported
    out = incident.out if incident.out is not None else math.inf
    name = incident.name
    book.charge(name, "detection", min(b, reported) - a)
    book.charge(name, "isolation", min(b, out) - max(a, reported))
    book.charge(name, "recovery" if came_back else "degraded", b - max(a, out, reported))


def _training(
    name: str, lines: Sequence[Progress], incidents: Sequence[Incident], gap_factor: float
) -> TrainingLedger:
    by_rank: dict[int, list[Progress]] = {}
    for p in lines:
        by_rank.setdefault(p.rank, []).append(p)
    deltas: list[float] = []
    for recs in by_rank.values():
        recs.sort(key=lambda p: (p.at, p.step))
        deltas.extend(q.at - p.at for p, q in itertools.pairwise(recs) if q.at > p.at)
    step_s = statistics.median(deltas) if deltas else 0.0
    start = min(p.at for p in lines) - step_s
    end = max(p.at for p in lines)
    nodes = {p.node for p in lines}
    limit = gap_factor * step_s
    book = _Book()
    productive = 0.0
    for recs in by_rank.values():
        prev_t, prev_node, best = start, "", -1
        last: Incident | None = None
        for p in recs:
            dt = p.at - prev_t
            work = dt
            if dt > limit:
                work = step_s
                last = _culprit(prev_node or p.node, nodes, prev_t, p.at - step_s, incidents)
                _split_gap(book, last, prev_t, p.at - step_s, came_back=True)
            if p.step <= best:
                book.charge(last.name if last else "", "redone", work)
            else:
                productive += work
                best = p.step
            prev_t, prev_node = p.at, p.node
        tail = end - prev_t
        if tail > limit:
            culprit = _culprit(prev_node, nodes, prev_t, end, incidents)
            _split_gap(book, culprit, prev_t, end, came_back=False)
        else:
            productive += tail
    lost = _zero()
    for charges in book.per.values():
        for k, v in charges.seconds.items():
            lost[k] += v
    return TrainingLedger(
        training=name,
        ranks=len(by_rank),
        groups=len({p.group for p in lines if p.group}) or 1,
        start=start,
        end=end,
        step_seconds=step_s,
        productive=productive,
        lost=lost,
        by_incident={k: dict(v.seconds) for k, v in sorted(book.per.items())},
    )


def ledger(
    progress: Iterable[Progress],
    incidents: Sequence[Incident],
    *,
    gap_factor: float = GAP_FACTOR,
) -> Ledger:
    """The ledger of every training in ``progress`` against ``incidents``."""
    by_training: dict[str, list[Progress]] = {}
    for p in progress:
        by_training.setdefault(p.training, []).append(p)
    trainings = tuple(
        _training(name, lines, incidents, gap_factor) for name, lines in sorted(by_training.items())
    )
    rows: list[IncidentLedger] = []
    for inc in sorted(incidents, key=lambda i: (i.reported, i.name)):
        lost = _zero()
        touched: list[str] = []
        for t in trainings:
            charged = t.by_incident.get(inc.name)
            if charged:
                touched.append(t.training)
                for k, v in charged.items():
                    lost[k] += v
        rows.append(IncidentLedger(inc, lost, tuple(touched)))
    return Ledger(trainings, tuple(rows))


def status_of(row: IncidentLedger) -> dict[str, Any]:
    """``status.goodput`` of a NodeRemediation: GPU-seconds lost per category."""
    return {
        "lostGpuSeconds": {k: round(v, 3) for k, v in row.lost.items()},
        "trainings": list(row.trainings),
    }
