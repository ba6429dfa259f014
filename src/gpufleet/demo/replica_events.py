"""The replica-group example's own log (``examples/torchft-replicas``), parsed once, and
what a fault cost it.

Every group appends JSON lines to one shared file: ``start`` (the step it starts
at and where that state came from: ``init``, ``checkpoint step N`` or ``peer
<group>``), ``step`` (step, quorum size), ``step-discarded`` (a step the quorum
did not commit: a peer failed during it), ``checkpoint`` (seconds the step was
blocked by the in-memory copy), ``checkpoint-saved``, ``departed``, ``done``.
What a fault cost is measured from what the groups did, not from what the demo
expected.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KINDS = frozenset(
    {"start", "step", "step-discarded", "checkpoint", "checkpoint-saved", "departed", "done"}
)


@dataclass(frozen=True)
class ReplicaEvent:
    kind: str
    group: str
    t: float
    step: int
    quorum: int = 0
    recovered_from: str = ""
    blocking_s: float = 0.0
    node: str = ""


def parse_events(text: str) -> list[ReplicaEvent]:
    """The events in file order; lines that are not complete events are skipped (a
    line being written, a kind this reader does not know)."""
    out: list[ReplicaEvent] = []
    for line in text.splitlines():
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict) or raw.get("kind") not in KINDS:
                continue
            out.append(
                ReplicaEvent(
                    kind=str(raw["kind"]),
                    group=str(raw["group"]),
                    t=float(raw["t"]),
                    step=int(raw["step"]),
                    quorum=int(raw.get("quorum", 0)),
                    recovered_from=str(raw.get("recovered_from", "")),
                    blocking_s=float(raw.get("blocking_s", 0.0)),
                    node=str(raw.get("node", "")),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out


def read_events(path: Path) -> list[ReplicaEvent]:
    """The events in the file at ``path`` (none before the first group wrote one)."""
    try:
        return parse_events(path.read_text())
    except FileNotFoundError:
        return []


def of(events: Iterable[ReplicaEvent], kind: str, group: str | None = None) -> list[ReplicaEvent]:
    return [e for e in events if e.kind == kind and (group is None or e.group == group)]


def last_step(events: Iterable[ReplicaEvent], group: str) -> int:
    """The group's newest committed step (0 before its first)."""
    return max((e.step for e in of(events, "step", group)), default=0)


@dataclass(frozen=True)
class SurvivorGap:
    """One surviving group across a window (a departure, a kill): how its steps went."""

    group: str
    steps_lost: int
    """Steps it computed that were thrown away or computed again."""
    gap_steps: int
    """Step numbers skipped between two consecutive committed steps (0: none)."""
    gap_s: float
    """The longest time between two consecutive committed steps."""


def survivor_gap(
    events: list[ReplicaEvent], group: str, start_t: float, end_t: float
) -> SurvivorGap:
    """How ``group`` fared between ``start_t`` and ``end_t``, including the step
    intervals that straddle either end."""
    steps = of(events, "step", group)
    window = [(a, b) for a, b in itertools.pairwise(steps) if b.t >= start_t and a.t <= end_t]
    seen: set[int] = set()
    repeated = 0
    for e in steps:
        repeated += e.step in seen
        seen.add(e.step)
    discarded = [e for e in of(events, "step-discarded", group) if start_t <= e.t <= end_t]
    return SurvivorGap(
        group=group,
        steps_lost=repeated + len(discarded),
        gap_steps=max((max(0, b.step - a.step - 1) for a, b in window), default=0),
        gap_s=max((b.t - a.t for a, b in window), default=0.0),
    )


def first_step_in_quorum(
    events: Iterable[ReplicaEvent], group: str, after_t: float, quorum: int
) -> ReplicaEvent | None:
    """The group's first committed step after ``after_t`` in a quorum of at least ``quorum``."""
    for e in of(events, "step", group):
        if e.t >= after_t and e.quorum >= quorum:
            return e
    return None


def checkpoint_blocking(events: Iterable[ReplicaEvent]) -> list[float]:
    """Seconds each checkpoint held its step (the in-memory copy), in order."""
    return [e.blocking_s for e in of(events, "checkpoint")]
