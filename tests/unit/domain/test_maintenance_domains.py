"""Whole NVLink domains in a MaintenancePlan (decision 0244): which domains start
(next_domains), what each domain's trays are fed (domain_moves), and decide's side: the
domain's budget yields to the plan's consent for that domain only, and the command runs
only when the plan says every tray is empty."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.domain import events as ev
from gpufleet.domain import maintenance as mt
from gpufleet.domain.actions import ActionKind
from gpufleet.domain.decide import decide
from gpufleet.domain.policy import Budget, DomainBudget, Policy, Safety, default_policy
from gpufleet.domain.records import FleetView, Incident, NodeRecord
from gpufleet.domain.safety import Hold
from gpufleet.domain.states import NodeState

S = NodeState
P = mt.NodePhase
ROLLOUT = mt.Rollout(scope=mt.Scope.NVLINK_DOMAIN)
SIZES = {"a": 3, "b": 3}


def tray(name: str, nvlink: str, phase: P = P.PENDING, state: S = S.PRODUCTION) -> mt.Candidate:
    return mt.Candidate(name, "gb200", nvlink, state, phase, nvlink=nvlink)


TRAYS = [tray(f"{d}{i}", d) for d in ("a", "b") for i in range(3)]
ROOM = mt.Room(pools={"gb200": 10}, domains={"a": 1, "b": 1})


def test_one_whole_domain_starts_and_its_own_budget_does_not_hold_it() -> None:
    batch = mt.next_domains(ROLLOUT, TRAYS, ROOM, now=0.0, sizes=SIZES, capacity=ROOM)
    assert batch.start == ("a0", "a1", "a2") and batch.domains == dict.fromkeys(batch.start, "a")
    two = replace(ROLLOUT, max_domains=2)
    assert len(mt.next_domains(two, TRAYS, ROOM, now=0.0, sizes=SIZES, capacity=ROOM).start) == 6


def test_a_domain_waits_for_room_for_all_its_trays_and_never_starts_in_part() -> None:
    room = mt.Room(pools={"gb200": 2})
    batch = mt.next_domains(ROLLOUT, TRAYS, room, now=0.0, sizes=SIZES, capacity=ROOM)
    assert batch.start == () and batch.why == "waiting: no budget room in pool gb200"
    assert not batch.blocked


def test_a_domain_larger_than_a_budget_ever_allows_blocks_the_plan() -> None:
    small = mt.Room(pools={"gb200": 2}, fleet=2)
    batch = mt.next_domains(ROLLOUT, TRAYS, small, now=0.0, sizes=SIZES, capacity=small)
    assert batch.start == ()
    assert batch.blocked == (
        "NVLink domain a: its 3 trays can never be out at once (the budget of pool gb200 "
        "allows fewer)"
    )


def test_a_domain_starts_only_wholly_selected_in_production_and_after_the_last() -> None:
    part = [t for t in TRAYS if t.name != "a2"]
    batch = mt.next_domains(ROLLOUT, part, ROOM, now=0.0, sizes=SIZES, capacity=ROOM)
    assert batch.start == ("b0", "b1", "b2")  # a: 2 of its 3 trays selected
    busy = [replace(t, state=S.TRIAGE) if t.name == "b1" else t for t in part]
    batch = mt.next_domains(ROLLOUT, busy, ROOM, now=0.0, sizes=SIZES, capacity=ROOM)
    assert batch.start == () and "2 of its 3 trays selected" in batch.why
    out = [replace(t, phase=P.UPDATING) if t.nvlink == "a" else t for t in TRAYS]
    assert mt.next_domains(ROLLOUT, out, ROOM, now=0.0, sizes=SIZES, capacity=ROOM).start == ()
    loose = [tray("x0", "")]
    batch = mt.next_domains(ROLLOUT, loose, ROOM, now=0.0, sizes=SIZES, capacity=ROOM)
    assert batch.why == "1 selected node(s) in no NVLink domain: not maintained"


# ------------------------------------------------------------------ domain_moves


def _rec(name: str, state: S, *, acting: bool = False, plan: str = "fw") -> NodeRecord:
    inc = Incident(
        key=mt.incident_key(plan),
        description=mt.reason(plan, mt.Action.COMMAND, None, "nvswitch-fw", whole_domain="a"),
        opened_at=1.0,
        plan=None,
        whole_domain="a",
        acting_since=5.0 if acting else None,
    )
    if acting:
        inc = replace(inc, description=mt.reason(plan, mt.Action.COMMAND, None, "nvswitch-fw"))
    return replace(NodeRecord.new(name, at=0.0, state=state), incident=inc, nvlink_domain="a")


def _tray(name: str, state: S, *, acting: bool = False, answered: bool = False) -> mt.Tray:
    phase = {S.MAINTENANCE: P.UPDATING, S.DRAINING: P.DRAINING, S.VERIFYING: P.VERIFYING}[state]
    return mt.Tray(name, _rec(name, state, acting=acting), phase, answered)


def _moves(
    *trays: mt.Tray, action: mt.Action = mt.Action.COMMAND, stopped: bool = False
) -> dict[str, str]:
    got = mt.domain_moves("fw", action, trays, command="nvswitch-fw", stopped=stopped)
    return {name: type(event).__name__ for name, event in got}


def test_nothing_runs_while_a_tray_is_still_on_its_way_out() -> None:
    assert _moves(_tray("a0", S.MAINTENANCE), _tray("a1", S.DRAINING)) == {}
    assert _moves(_tray("a0", S.MAINTENANCE), _tray("a1", S.MAINTENANCE)) == {
        "a0": "DomainEmptied",
        "a1": "DomainEmptied",
    }
    noop = _moves(_tray("a0", S.MAINTENANCE), _tray("a1", S.MAINTENANCE), action=mt.Action.NOOP)
    assert noop == {"a0": "MaintenanceCompleted", "a1": "MaintenanceCompleted"}


def test_nothing_runs_while_a_tray_the_plan_held_back_serves() -> None:
    """A tray whose request a paused plan took back is in production: the two drained
    trays wait, the command is not asked of them."""
    serving = mt.Tray("a2", NodeRecord.new("a2", at=0.0), P.PENDING, False)
    assert _moves(_tray("a0", S.MAINTENANCE), _tray("a1", S.MAINTENANCE), serving) == {}


def test_none_returns_before_every_tray_answered() -> None:
    one = _tray("a0", S.MAINTENANCE, acting=True, answered=True)
    two = _tray("a1", S.MAINTENANCE, acting=True)
    assert _moves(one, two) == {}
    assert _moves(one, replace(two, answered=True)) == {
        "a0": "MaintenanceCompleted",
        "a1": "MaintenanceCompleted",
    }
    # A tray whose completion a rail held is completed again once another has gone on.
    assert _moves(_tray("a0", S.VERIFYING, acting=True), one) == {"a0": "MaintenanceCompleted"}


def test_a_go_a_rail_held_is_fed_again_and_a_stopped_plan_returns_unacted_trays() -> None:
    acted = _tray("a0", S.MAINTENANCE, acting=True)
    assert _moves(acted, _tray("a1", S.MAINTENANCE)) == {"a1": "DomainEmptied"}
    fresh = (_tray("a0", S.MAINTENANCE), _tray("a1", S.MAINTENANCE))
    assert _moves(*fresh, stopped=True) == {
        "a0": "MaintenanceCompleted",
        "a1": "MaintenanceCompleted",
    }
    assert _moves(acted, _tray("a1", S.MAINTENANCE), stopped=True) == {}


# ------------------------------------------------------------------------ decide


def _policy(**kw: object) -> Policy:
    safety = Safety(budget=Budget(max_nodes=10, max_percent=100.0, per_domain=DomainBudget()))
    return default_policy().model_copy(update={"safety": safety, **kw})


def _fleet(out: int) -> tuple[FleetView, dict[str, NodeRecord]]:
    records = {}
    for i in range(3):
        state = S.DRAINING if i < out else S.PRODUCTION
        rec = NodeRecord.new(f"a{i}", at=0.0, pool="gb200", state=state)
        records[rec.name] = replace(rec, nvlink_domain="a")
    other = replace(NodeRecord.new("b0", at=0.0, pool="gb200"), nvlink_domain="b")
    records["b0"] = other
    return FleetView.of(records.values()), records


def test_the_plans_consent_lifts_its_domains_budget_and_no_other() -> None:
    policy = _policy()
    fleet, records = _fleet(out=1)
    whole = mt.request("fw", mt.Action.COMMAND, command="nvswitch-fw", whole_domain="a")
    d = decide(records["a1"], fleet, whole, policy, 2.0)
    assert d.hold is None and d.record.state is S.DRAINING
    assert d.record.incident is not None and d.record.incident.whole_domain == "a"
    assert not any(a.kind is ActionKind.RUN_COMMAND for a in d.actions)
    # A node-scope request, or one consenting for another domain, is held by k.
    plain = mt.request("fw", mt.Action.COMMAND, command="nvswitch-fw")
    assert decide(records["a1"], fleet, plain, policy, 2.0).hold is Hold.BUDGET_EXHAUSTED
    other = mt.request("fw", mt.Action.COMMAND, command="nvswitch-fw", whole_domain="b")
    assert decide(records["a1"], fleet, other, policy, 2.0).hold is Hold.BUDGET_EXHAUSTED


def test_the_command_runs_once_on_the_plans_word_through_pause_and_dry_run() -> None:
    fleet, _ = _fleet(out=0)
    waiting = _rec("a0", S.MAINTENANCE)
    assert mt.command_of(waiting) is None  # drained, nothing asked of the agent yet
    go = ev.DomainEmptied(
        mt.reason("fw", mt.Action.COMMAND, None, "nvswitch-fw"), key=mt.incident_key("fw")
    )
    d = decide(waiting, fleet, go, _policy(), 9.0)
    assert [a.kind for a in d.actions] == [ActionKind.RUN_COMMAND]
    assert mt.command_of(d.record) == "nvswitch-fw" and d.record.incident.acting_since == 9.0
    again = decide(d.record, fleet, go, _policy(), 10.0)
    assert again.actions == () and again.record == d.record
    for rail, hold in (("paused", Hold.PAUSED), ("dry_run", Hold.DRY_RUN)):
        held = decide(waiting, fleet, go, _policy(**{rail: True}), 9.0)
        assert held.hold is hold and held.record == waiting
    other = ev.DomainEmptied(go.reason, key=mt.incident_key("other"))
    assert decide(waiting, fleet, other, _policy(), 9.0).actions == ()


def test_a_passed_answer_waits_for_the_plan_and_the_overdue_clock_starts_at_the_ask() -> None:
    acting = _rec("a0", S.MAINTENANCE, acting=True)
    assert mt.command_answered(acting, True, "ok") is None
    assert isinstance(mt.command_answered(acting, False, "exit 1"), ev.MaintenanceFailed)
    # Asked at 5.0; the node entered maintenance at 0.0.
    limit = mt.DEFAULT_COMMAND_TIMEOUT_S + mt.COMMAND_ANSWER_GRACE_S
    assert mt.command_overdue(acting, now=limit + 4.0) is None
    assert mt.command_overdue(acting, now=limit + 6.0) is not None


def test_only_a_command_or_noop_runs_on_a_whole_domain() -> None:
    with pytest.raises(ValueError, match="command or noop"):
        mt.request("fw", mt.Action.REBOOT, whole_domain="a")
