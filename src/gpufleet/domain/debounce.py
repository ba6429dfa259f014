"""Debounce of Node problem conditions: observations in, condition state out.

The agent observes each subsystem periodically. An observation is either a
*state* (a port is down right now, a row remap is pending) or an *instant*
(an XID line was logged at time t). :func:`observe` folds one observation
into a :class:`ConditionState` under the policy's :class:`Detection`
settings:

* a state problem must be seen continuously for ``raise_after_seconds``
  before the condition is raised, so that a port that bounces once does not
  flip the condition;
* an instant raises at once (it already happened; there is nothing to wait
  for), which is also why ``raise_after_seconds`` cannot hide an XID;
* a raised condition clears only after ``clear_after_seconds`` without any
  problem, so that an intermittent fault holds the condition instead of
  flapping it;
* when a monitor cannot read its source and nothing is wrong, the status is
  ``Unknown``, never ``True``: a broken monitor is not a broken node;
* a raised condition clears only once the lifecycle controller has *recorded*
  its faults: ``recorded_until`` (the controller's ``gpufleet.io/faults-seen``
  watermark for the condition, :func:`gpufleet.domain.conditions.faults_recorded`)
  must be at or after the latest occurrence the condition carries. Until then
  the condition stays ``True`` with its evidence, however long the fault has
  been gone: a fault raised and cleared while no controller was acting (a
  takeover, a restart, a clear time shorter than the outage) is still there
  for the one that acts next. ``recorded_until=None`` means no controller is
  waited for (an agent without Kubernetes). :func:`adopt` carries a raised
  condition a previous agent left on the Node into a new agent's state, so an
  agent restart cannot drop an unrecorded fault either.

The faults that explain a raised condition are kept, so that the condition
message carries the evidence even after the fault itself stopped being
observed: for a state, its latest observation per fault key and component;
for instants, every distinct occurrence (the most recent
:data:`~gpufleet.domain.conditions.MAX_OCCURRENCES`), because repeat rules
count them — three link flaps must reach the controller as three.

Pure: the caller passes ``now``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from gpufleet.domain.conditions import MAX_OCCURRENCES
from gpufleet.domain.faults import FaultEvent
from gpufleet.domain.policy import Detection


class Status(StrEnum):
    """Kubernetes condition status, Node-Problem-Detector convention."""

    PROBLEM = "True"
    HEALTHY = "False"
    UNKNOWN = "Unknown"


@dataclass(frozen=True, slots=True)
class Observation:
    """What the monitors of one subsystem saw at one time."""

    at: float
    faults: tuple[FaultEvent, ...] = ()
    """Faults present now (state) or logged since the last observation (instant)."""
    instant: tuple[FaultEvent, ...] = ()
    """Faults that are events rather than states (XIDs, flaps, lockups)."""
    readable: bool = True
    """False when no monitor of the subsystem could read its source."""
    unreadable_reason: str = ""


@dataclass(frozen=True, slots=True)
class ConditionState:
    """The debounced state of one subsystem's problem condition."""

    status: Status = Status.UNKNOWN
    changed_at: float | None = None
    """When ``status`` last changed (the condition's lastTransitionTime)."""
    bad_since: float | None = None
    """Start of the current uninterrupted run of state problems."""
    last_bad: float | None = None
    """When a problem (state or instant) was last observed."""
    faults: tuple[FaultEvent, ...] = ()
    """The faults behind the current or last raise, oldest first."""
    note: str = ""
    """Why the status is Unknown, when it is."""

    @property
    def problem(self) -> bool:
        """Whether the condition is raised."""
        return self.status is Status.PROBLEM


def _merge(
    old: Sequence[FaultEvent], present: Sequence[FaultEvent], instant: Sequence[FaultEvent]
) -> tuple[FaultEvent, ...]:
    """Old evidence plus this observation: a state present now replaces its earlier
    observations (same key and component); instants are kept one per occurrence."""
    current = {(f.key, f.evidence.scope()) for f in present}
    kept = [f for f in old if (f.key, f.evidence.scope()) not in current]
    seen = {(f.key, f.evidence.scope(), f.at) for f in kept}
    for fault in (*present, *instant):
        ident = (fault.key, fault.evidence.scope(), fault.at)
        if ident not in seen:
            seen.add(ident)
            kept.append(fault)
    kept.sort(key=lambda f: f.at)
    return tuple(kept[-MAX_OCCURRENCES:])


def recorded(state: ConditionState, recorded_until: float | None) -> bool:
    """Whether the controller has recorded every occurrence behind ``state``: its
    watermark is at or after the latest of them (None: no controller is waited for)."""
    if recorded_until is None or not state.faults:
        return True
    return max(f.at for f in state.faults) <= recorded_until


def adopt(state: ConditionState, faults: Sequence[FaultEvent], now: float) -> ConditionState:
    """``state`` with a raised condition's occurrences carried over (a previous agent's,
    found on the Node, not yet recorded by the controller): raised, with them as evidence."""
    if not faults:
        return state
    kept = _merge(state.faults if state.problem else (), (), faults)
    last = max(f.at for f in faults)
    last_bad = last if state.last_bad is None else max(state.last_bad, last)
    changed = state.changed_at if state.problem else now
    return ConditionState(Status.PROBLEM, changed, state.bad_since, last_bad, kept)


def observe(
    state: ConditionState,
    obs: Observation,
    detection: Detection,
    recorded_until: float | None = None,
) -> ConditionState:
    """The condition after one more observation; a raised one is held until
    ``recorded_until`` covers its occurrences (see the module docstring)."""
    now = obs.at
    present = obs.faults
    instant = obs.instant
    bad = bool(present or instant)
    if bad:
        bad_since = (state.bad_since if state.bad_since is not None else now) if present else None
        seen = _merge(state.faults if state.problem else (), present, instant)
        due = bool(instant) or (
            bad_since is not None and now - bad_since >= detection.raise_after_seconds
        )
        if state.problem or due:
            changed = state.changed_at if state.problem else now
            return ConditionState(Status.PROBLEM, changed, bad_since, now, seen)
        # Seen, but not long enough yet: keep the previous status.
        return replace(state, bad_since=bad_since, last_bad=now, faults=seen)
    if state.problem:
        quiet_for = now - (state.last_bad if state.last_bad is not None else now)
        if quiet_for < detection.clear_after_seconds or not recorded(state, recorded_until):
            return replace(state, bad_since=None)
    if not obs.readable:
        if state.status is Status.UNKNOWN:
            return replace(state, bad_since=None, note=obs.unreadable_reason)
        return ConditionState(Status.UNKNOWN, now, None, state.last_bad, (), obs.unreadable_reason)
    if state.status is Status.HEALTHY:
        return replace(state, bad_since=None)
    return ConditionState(Status.HEALTHY, now, None, state.last_bad, state.faults)


def clears_at(state: ConditionState, detection: Detection) -> float | None:
    """When a raised condition will clear if nothing new is seen (None: not raised)."""
    if not state.problem or state.last_bad is None:
        return None
    return state.last_bad + detection.clear_after_seconds
