"""The node lifecycle state machine: states, the transition table, transitions.

The table is the single authority on which moves are legal. Every part of
gpufleet changes a node's state only through :func:`transition`, which
raises :class:`IllegalTransition` for anything the table does not allow, so a
bug elsewhere cannot, for example, return a node from ``rma`` straight to
``production``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class NodeState(StrEnum):
    """Where a node is in its life. The value is the ``gpufleet.io/state`` label."""

    PROVISIONING = "provisioning"
    """Booting and joining (Day 0); no work yet."""
    BURN_IN = "burn-in"
    """Running the long active-check profile before first use (Day 1)."""
    PRODUCTION = "production"
    """Schedulable; passive monitors and idle-time active checks run (Day 2+)."""
    DRAINING = "draining"
    """Cordoned and tainted; workloads are leaving or being requeued."""
    REMEDIATING = "remediating"
    """Walking the remediation ladder (GPU reset, reboot, power cycle, reimage)."""
    VERIFYING = "verifying"
    """Repaired; active checks must pass before it returns to production."""
    MAINTENANCE = "maintenance"
    """Taken out on purpose by an operator (firmware, cabling, upgrades)."""
    TRIAGE = "triage"
    """Automation gave up: a human decides (lemon, ladder exhausted, mismatch)."""
    RMA = "rma"
    """Hardware goes back to the vendor; only a hardware replacement ends it."""


class Trigger(StrEnum):
    """What caused a transition. Some edges are legal only for one trigger."""

    FAULT = "fault"
    DRAIN_COMPLETED = "drain-completed"
    STEP_SUCCEEDED = "step-succeeded"
    STEP_FAILED = "step-failed"
    VERIFICATION_PASSED = "verification-passed"
    VERIFICATION_FAILED = "verification-failed"
    BURN_IN_PASSED = "burn-in-passed"
    BURN_IN_FAILED = "burn-in-failed"
    REGISTERED = "registered"
    INVENTORY_MISMATCH = "inventory-mismatch"
    MAINTENANCE_REQUESTED = "maintenance-requested"
    MAINTENANCE_COMPLETED = "maintenance-completed"
    MAINTENANCE_FAILED = "maintenance-failed"
    OPERATOR = "operator"
    LEMON = "lemon"
    LADDER_EXHAUSTED = "ladder-exhausted"
    HARDWARE_REPLACED = "hardware-replaced"
    WORK_FOUND = "work-found"
    DOMAIN_FAULT = "domain-fault"
    """The node's NVLink domain was judged faulty (domain.domain_faults)."""
    DOMAIN_REPAIRED = "domain-repaired"
    """The node's held NVLink domain reports healthy again."""


S = NodeState

TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    S.PROVISIONING: frozenset({S.BURN_IN, S.TRIAGE, S.MAINTENANCE}),
    S.BURN_IN: frozenset({S.PRODUCTION, S.TRIAGE, S.MAINTENANCE}),
    S.PRODUCTION: frozenset({S.DRAINING}),
    S.DRAINING: frozenset({S.REMEDIATING, S.VERIFYING, S.MAINTENANCE, S.TRIAGE, S.RMA}),
    S.REMEDIATING: frozenset({S.VERIFYING, S.DRAINING, S.TRIAGE, S.RMA}),
    S.VERIFYING: frozenset({S.PRODUCTION, S.REMEDIATING, S.TRIAGE, S.RMA}),
    S.MAINTENANCE: frozenset({S.VERIFYING, S.DRAINING, S.TRIAGE, S.RMA}),
    S.TRIAGE: frozenset({S.VERIFYING, S.REMEDIATING, S.MAINTENANCE, S.RMA}),
    S.RMA: frozenset({S.PROVISIONING}),
}
"""Legal moves, from each state. Nothing enters production without passing
burn-in or verification, and every way out of production goes through
draining, so that running jobs are requeued before anything disruptive."""

GUARDED: Mapping[tuple[NodeState, NodeState], Trigger] = {
    (S.RMA, S.PROVISIONING): Trigger.HARDWARE_REPLACED,
    (S.REMEDIATING, S.DRAINING): Trigger.WORK_FOUND,
    (S.MAINTENANCE, S.DRAINING): Trigger.WORK_FOUND,
    (S.DRAINING, S.VERIFYING): Trigger.DOMAIN_REPAIRED,
}
"""Edges that only one trigger may take."""

OUT_OF_SERVICE: frozenset[NodeState] = frozenset({S.DRAINING, S.REMEDIATING, S.VERIFYING})
"""States that count against the disruption budget: nodes automation is
currently holding out of production. ``triage``, ``rma`` and ``maintenance``
are owned by people and do not count (see docs/decisions/0003)."""

SERVING: frozenset[NodeState] = frozenset({S.PRODUCTION})
"""States in which a node takes work."""


class IllegalTransition(ValueError):
    """Raised when code asks for a move the transition table forbids."""

    def __init__(self, source: NodeState, target: NodeState, trigger: Trigger) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[source])) or "none"
        super().__init__(
            f"illegal transition {source} -> {target} (trigger {trigger}); "
            f"from {source} the allowed targets are: {allowed}"
        )
        self.source = source
        self.target = target
        self.trigger = trigger


@dataclass(frozen=True, slots=True)
class Transition:
    """One recorded move: it always says why and when."""

    source: NodeState
    target: NodeState
    trigger: Trigger
    reason: str
    at: float
    """Seconds since the epoch (or since the start of a simulation)."""


def is_legal(source: NodeState, target: NodeState, trigger: Trigger) -> bool:
    """Whether the table allows ``source -> target`` for this trigger."""
    if target not in TRANSITIONS[source]:
        return False
    required = GUARDED.get((source, target))
    return required is None or required == trigger


def transition(
    source: NodeState, target: NodeState, *, trigger: Trigger, reason: str, at: float
) -> Transition:
    """Validate and record a move; raise :class:`IllegalTransition` if it is not legal."""
    if not is_legal(source, target, trigger):
        raise IllegalTransition(source, target, trigger)
    if not reason:
        raise ValueError("a transition needs a reason")
    return Transition(source=source, target=target, trigger=trigger, reason=reason, at=at)
