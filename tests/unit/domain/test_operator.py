"""Operator verbs: the request format, which verb is legal where, and what decide does."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from gpufleet.domain import events as ev
from gpufleet.domain import operator
from gpufleet.domain.actions import ActionKind
from gpufleet.domain.decide import decide
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.faults import FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy, default_policy, load_policy
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.safety import BreakerState, breaker_reset, breaker_reset_refusal
from gpufleet.domain.states import NodeState, Trigger

from .conftest import fault, make_fleet, xid

S = NodeState


def request(verb: str, **kw: object) -> operator.OperatorRequest:
    base: dict[str, object] = {
        "verb": verb,
        "reason": "GPU 6 reseated",
        "by": "alice",
        "at": 100.0,
        "id": "r1",
    }
    base.update(kw)
    return operator.OperatorRequest(**base)  # type: ignore[arg-type]


def kinds(d: object) -> list[ActionKind]:
    return [a.kind for a in d.actions]  # type: ignore[attr-defined]


def policy_with(**safety: object) -> Policy:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data.update(safety)
    return load_policy(yaml.safe_dump(data))


# ------------------------------------------------------------------ format


def test_request_round_trips_and_names_the_user_in_the_reason() -> None:
    req = request("return", hardware_replaced=True)
    back = operator.OperatorRequest.decode(req.encode())
    assert back == req
    assert back.text == "by alice: GPU 6 reseated"
    assert operator.event_for(back) == ev.HardwareReplaced("by alice: GPU 6 reseated")
    assert operator.event_for(request("return")) == ev.OperatorReturn("by alice: GPU 6 reseated")
    assert isinstance(operator.event_for(request("dismiss")), ev.OperatorDismiss)
    assert isinstance(operator.event_for(request("maintenance")), ev.MaintenanceRequested)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"verb":"reboot","reason":"x","by":"a","at":1}', "unknown verb 'reboot'"),
        ('{"verb":"return","reason":" ","by":"a","at":1}', "needs a reason"),
        ('{"verb":"return","reason":"x","at":1}', "needs the user"),
        ('{"verb":"return","reason":"x","by":"a","at":"soon"}', "needs a time"),
    ],
)
def test_an_unreadable_request_is_refused_with_what_is_wrong(text: str, problem: str) -> None:
    got = operator.receive(text)
    assert got.event is None and got.problem is not None and problem in got.problem
    rec = NodeRecord.new("n", at=0, state=S.TRIAGE)
    ok, message = operator.answer(got, rec, held=None, transition=None, reasons=())
    assert not ok and problem in message and message.startswith("refused:")


# ---------------------------------------------------------------- decisions


def test_return_from_triage_verifies_then_production_with_the_user_in_history() -> None:
    f = make_fleet(10)
    f.send("n1", fault("n1", FaultKind.SDC_MISMATCH, at=0, gpu_index=6), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    assert f.state("n1") is S.TRIAGE
    got = operator.receive(request("return").encode())
    before = f.records["n1"]
    assert got.event is not None
    d = f.send("n1", got.event, now=2)
    assert f.state("n1") is S.VERIFYING and ActionKind.RUN_CHECKS in kinds(d)
    assert d.transition.trigger is Trigger.OPERATOR
    assert d.transition.reason == "by alice: GPU 6 reseated"
    ok, message = operator.answer(
        got, before, held=None, transition=d.transition, reasons=d.reasons
    )
    assert ok and message.startswith("[r1] return by alice: accepted: triage -> verifying")
    f.send("n1", ev.ChecksCompleted(passed=True), now=3)
    assert f.state("n1") is S.PRODUCTION


def test_return_from_maintenance_is_verified_too() -> None:
    f = make_fleet(10)
    f.send("n1", ev.MaintenanceRequested("by bob: firmware"), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    assert f.state("n1") is S.MAINTENANCE
    d = f.send("n1", ev.OperatorReturn("by bob: firmware done"), now=2)
    assert f.state("n1") is S.VERIFYING and ActionKind.RUN_CHECKS in kinds(d)


@pytest.mark.parametrize(
    ("state", "verb", "why"),
    [
        (S.PRODUCTION, "return", "return needs a node in triage or maintenance"),
        (S.RMA, "return", "--hardware-replaced"),
        (S.PRODUCTION, "rma", "rma needs a node in triage or maintenance"),
        (S.TRIAGE, "triage", "already in triage"),
        (S.RMA, "triage", "not possible from rma"),
        (S.REMEDIATING, "maintenance", "maintenance needs a node in"),
        (S.PRODUCTION, "dismiss", "nothing to dismiss"),
    ],
)
def test_an_illegal_verb_changes_nothing_and_says_why(
    state: NodeState, verb: str, why: str
) -> None:
    rec = NodeRecord.new("n", at=0, state=state)
    got = operator.receive(request(verb).encode())
    assert got.event is not None
    fleet = make_fleet(1).view
    d = decide(rec, fleet, got.event, default_policy(), 5)
    assert d.transition is None and not d.actions and d.record == rec
    assert any(why in r for r in d.reasons)
    ok, message = operator.answer(got, rec, held=None, transition=None, reasons=d.reasons)
    assert not ok and why in message and "[r1] " + verb in message


def test_rma_needs_a_hardware_replacement_to_come_back() -> None:
    rec = NodeRecord.new("n", at=0, state=S.RMA)
    fleet = make_fleet(1).view
    event = operator.event_for(request("return", hardware_replaced=True))
    d = decide(rec, fleet, event, default_policy(), 5)
    assert d.transition is not None and d.transition.target is S.PROVISIONING
    assert d.transition.trigger is Trigger.HARDWARE_REPLACED


def test_triage_of_a_production_node_drains_it_first_then_triage() -> None:
    f = make_fleet(10)
    d = f.send("n1", ev.OperatorTriage("by alice: flaky NCCL"), now=0)
    assert f.state("n1") is S.DRAINING
    assert kinds(d) == [ActionKind.CORDON, ActionKind.TAINT, ActionKind.DRAIN]
    inc = f.records["n1"].incident
    assert inc is not None and inc.plan is Step.TRIAGE and inc.key == "operator"
    assert d.breaker is None  # an operator's request is not a fault for the breaker
    d = f.send("n1", ev.DrainCompleted(), now=1)
    assert f.state("n1") is S.TRIAGE
    assert not any(a.kind is ActionKind.RUN_STEP for a in d.actions)
    assert "by alice: flaky NCCL" in f.records["n1"].reason


def test_triage_is_held_by_the_budget_like_any_isolation() -> None:
    f = make_fleet(10, policy_with(safety={"budget": {"maxNodes": 1}}))
    f.send("n1", xid("n1", 79, at=0), now=0)
    assert f.state("n1") is S.DRAINING
    d = f.send("n2", ev.OperatorTriage("by alice: suspect"), now=1)
    assert f.state("n2") is S.PRODUCTION and d.hold is not None and not d.actions
    got = operator.Received(request("triage"), ev.OperatorTriage("by alice: suspect"))
    ok, message = operator.answer(
        got, f.records["n2"], held=str(d.hold), transition=None, reasons=d.reasons
    )
    assert not ok and "disruption budget" in message


@pytest.mark.parametrize("flag", ["paused", "dryRun"])
def test_operator_verbs_obey_pause_and_dry_run(flag: str) -> None:
    f = make_fleet(10, policy_with(**{flag: True}))
    f.records["n1"] = replace(f.records["n1"], state=S.TRIAGE)
    d = f.send("n1", ev.OperatorReturn("by alice: fixed"), now=1)
    assert f.state("n1") is S.TRIAGE and d.hold is not None and not d.actions


def test_triage_of_a_node_being_repaired_or_drained() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=0), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    assert f.state("n1") is S.REMEDIATING
    d = f.send("n1", ev.OperatorTriage("by alice: stop"), now=2)
    assert f.state("n1") is S.TRIAGE and d.transition.trigger is Trigger.OPERATOR
    assert f.records["n1"].incident.current is None
    # A step result that arrives afterwards is not the step in progress any more.
    d = f.send("n1", ev.StepCompleted(Step.REBOOT, True), now=3)
    assert f.state("n1") is S.TRIAGE and d.transition is None
    f.send("n2", xid("n2", 79, at=0), now=0)
    d = f.send("n2", ev.OperatorTriage("by alice: hold it"), now=1)
    assert f.state("n2") is S.DRAINING and f.records["n2"].incident.plan is Step.TRIAGE
    f.send("n2", ev.DrainCompleted(), now=2)
    assert f.state("n2") is S.TRIAGE


def test_rma_from_triage() -> None:
    f = make_fleet(10)
    f.records["n1"] = replace(f.records["n1"], state=S.TRIAGE)
    d = f.send("n1", ev.OperatorRMA("by alice: dead HBM"), now=1)
    assert f.state("n1") is S.RMA and ActionKind.NOTIFY in kinds(d)


def test_dismiss_drops_a_held_fault_and_says_so_even_when_paused() -> None:
    f = make_fleet(10, policy_with(paused=True))
    f.send("n1", xid("n1", 79, at=0), now=0)
    held = f.records["n1"]
    assert held.pending is not None and f.state("n1") is S.PRODUCTION
    d = f.send("n1", ev.OperatorDismiss("by alice: known monitoring bug"), now=1)
    assert f.records["n1"].pending is None and f.records["n1"].pending_step is None
    assert d.hold is None and kinds(d) == [ActionKind.NOTIFY]
    assert "xid-79" in d.actions[0].detail and "by alice" in d.actions[0].detail
    f.send("n1", ev.Tick(), now=2)
    assert f.records["n1"].pending is None and f.state("n1") is S.PRODUCTION


def test_breaker_reset_closes_and_empties_the_window_unless_it_tripped_later() -> None:
    tripped = BreakerState(recent=((5.0, "a"), (6.0, "b")), tripped_at=6.0, last_fault_at=6.0)
    assert breaker_reset_refusal(tripped, requested_at=10.0) is None
    closed = breaker_reset(tripped)
    assert not closed.is_open and closed.recent == ()
    why = breaker_reset_refusal(tripped, requested_at=5.0)
    assert why is not None and "tripped again" in why
    assert breaker_reset_refusal(BreakerState(), requested_at=0.0) is None
