"""The demo's observer tells every move of a Node's state, also one shorter than its poll."""

from __future__ import annotations

from typing import Any

from gpufleet.api import nodedata
from gpufleet.demo.observe import passed_through
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState, Transition, Trigger

S = NodeState
KEY = nodedata.SigningKey.of(b"k" * 32)


def _node(*moves: tuple[S, S, Trigger]) -> dict[str, Any]:
    history = tuple(Transition(a, b, t, "why", 100.0 + i) for i, (a, b, t) in enumerate(moves))
    state = moves[-1][1] if moves else S.PROVISIONING
    record = NodeRecord(name="n1", state=state, since=100.0, reason="why", history=history)
    return {"metadata": {"name": "n1", "annotations": nodedata.record_annotations(record, KEY)}}


def test_a_burn_in_shorter_than_a_poll_is_told_from_the_records_history() -> None:
    body = _node(
        (S.PROVISIONING, S.BURN_IN, Trigger.REGISTERED),
        (S.BURN_IN, S.PRODUCTION, Trigger.BURN_IN_PASSED),
    )
    assert passed_through(body, "provisioning", "production") == [
        ("provisioning", "burn-in", 100.0),
        ("burn-in", "production", 101.0),
    ]
    # a poll that saw burn-in: only the last move
    assert passed_through(body, "burn-in", "production") == [("burn-in", "production", 101.0)]


def test_without_a_history_that_joins_the_two_states_the_label_is_told() -> None:
    assert passed_through({"metadata": {"name": "n1"}}, "provisioning", "production") == [
        ("provisioning", "production", None)
    ]
    body = _node((S.BURN_IN, S.PRODUCTION, Trigger.BURN_IN_PASSED))
    assert passed_through(body, "draining", "production") == [("draining", "production", None)]
