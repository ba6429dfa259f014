from __future__ import annotations

import pytest

from gpufleet.domain.states import (
    TRANSITIONS,
    IllegalTransition,
    NodeState,
    Trigger,
    is_legal,
    transition,
)

S = NodeState


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(NodeState)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (S.PRODUCTION, S.VERIFYING),
        (S.PRODUCTION, S.REMEDIATING),
        (S.RMA, S.PRODUCTION),
        (S.TRIAGE, S.PRODUCTION),
        (S.PROVISIONING, S.PRODUCTION),
        (S.REMEDIATING, S.PRODUCTION),
    ],
)
def test_shortcuts_into_production_are_illegal(source: NodeState, target: NodeState) -> None:
    with pytest.raises(IllegalTransition) as err:
        transition(source, target, trigger=Trigger.OPERATOR, reason="x", at=1.0)
    assert f"{source} -> {target}" in str(err.value)
    assert "allowed targets" in str(err.value)


def test_rma_returns_only_on_hardware_replacement() -> None:
    for trigger in Trigger:
        ok = is_legal(S.RMA, S.PROVISIONING, trigger)
        assert ok == (trigger is Trigger.HARDWARE_REPLACED)
    t = transition(S.RMA, S.PROVISIONING, trigger=Trigger.HARDWARE_REPLACED, reason="new", at=5)
    assert (t.source, t.target, t.reason, t.at) == (S.RMA, S.PROVISIONING, "new", 5)


def test_a_transition_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="reason"):
        transition(S.PRODUCTION, S.DRAINING, trigger=Trigger.FAULT, reason="", at=0)


def test_production_is_entered_only_after_checks() -> None:
    into_production = {s for s, targets in TRANSITIONS.items() if S.PRODUCTION in targets}
    assert into_production == {S.BURN_IN, S.VERIFYING}


def test_every_way_out_of_production_drains_first() -> None:
    assert TRANSITIONS[S.PRODUCTION] == frozenset({S.DRAINING})
