"""apply_decision: the one rule by which every executor updates its fleet view."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.actions import Action, ActionKind
from gpufleet.domain.apply import apply_decision
from gpufleet.domain.decide import Decision
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy, default_policy
from gpufleet.domain.records import FleetView, NodeRecord, PoolView
from gpufleet.domain.safety import BreakerState
from gpufleet.domain.states import NodeState

S = NodeState


def _rec(name: str, state: NodeState = S.PRODUCTION, pool: str = "a") -> NodeRecord:
    return NodeRecord.new(name, at=0.0, pool=pool, state=state)


def _policy(window: float = 600.0) -> Policy:
    p = default_policy()
    rate = p.safety.rate_limit.model_copy(update={"window_seconds": window})
    return p.model_copy(update={"safety": p.safety.model_copy(update={"rate_limit": rate})})


DRAIN = Action(ActionKind.DRAIN)
NOTIFY = Action(ActionKind.NOTIFY)


def test_a_node_taken_out_counts_against_its_pool() -> None:
    before = _rec("n0")
    fleet = FleetView.of([before, _rec("n1"), _rec("m0", pool="b")])
    after = apply_decision(
        fleet, before, Decision(replace(before, state=S.DRAINING)), now=5.0, policy=_policy()
    )
    assert after.pool("a") == PoolView(size=2, out_of_service=1)
    assert after.pool("b") == PoolView(size=1, out_of_service=0)
    assert fleet.pool("a").out_of_service == 0  # the view is a value: the input is unchanged


def test_a_node_the_view_has_not_counted_joins_its_pool() -> None:
    fleet = FleetView.of([_rec("n0")])
    new = _rec("n1", state=S.REMEDIATING)
    after = apply_decision(fleet, None, Decision(new), now=1.0, policy=_policy())
    assert after.pool("a") == PoolView(size=2, out_of_service=1)
    assert after == replace(after, pools=FleetView.of([_rec("n0"), new]).pools)


def test_the_breaker_follows_the_decision_only_when_it_carries_one() -> None:
    tripped = BreakerState(recent=((1.0, "n0"),), tripped_at=1.0, last_fault_at=1.0)
    before = _rec("n0")
    fleet = FleetView.of([before], breaker=tripped)
    kept = apply_decision(fleet, before, Decision(before), now=2.0, policy=_policy())
    assert kept.breaker == tripped
    closed = apply_decision(
        fleet, before, Decision(before, breaker=BreakerState()), now=2.0, policy=_policy()
    )
    assert closed.breaker == BreakerState()


def test_a_disruptive_action_is_remembered_and_old_ones_age_out() -> None:
    before = _rec("n0")
    fleet = FleetView.of([before], recent_actions=(10.0, 50.0))
    after = apply_decision(
        fleet, before, Decision(before, actions=(NOTIFY, DRAIN)), now=100.0, policy=_policy(60.0)
    )
    assert after.recent_actions == (50.0, 100.0)


def test_a_reboot_is_disruptive_a_notification_is_not() -> None:
    before = _rec("n0")
    fleet = FleetView.of([before], recent_actions=(10.0,))
    quiet = apply_decision(
        fleet, before, Decision(before, actions=(NOTIFY,)), now=1000.0, policy=_policy(60.0)
    )
    assert quiet.recent_actions == (10.0,)  # nothing pruned either: no action was counted
    reboot = Action(ActionKind.RUN_STEP, step=Step.REBOOT)
    loud = apply_decision(
        fleet, before, Decision(before, actions=(reboot,)), now=1000.0, policy=_policy(60.0)
    )
    assert loud.recent_actions == (1000.0,)


_STATES = st.sampled_from(list(NodeState))


@given(
    start=st.lists(_STATES, min_size=1, max_size=6),
    moves=st.lists(st.tuples(st.integers(0, 5), _STATES), max_size=20),
)
def test_applying_decisions_one_by_one_counts_like_a_fresh_view(
    start: list[NodeState], moves: list[tuple[int, NodeState]]
) -> None:
    records = {f"n{i}": _rec(f"n{i}", s, pool=("a", "b")[i % 2]) for i, s in enumerate(start)}
    fleet = FleetView.of(records.values())
    for i, state in moves:
        name = f"n{i % len(start)}"
        before = records[name]
        records[name] = replace(before, state=state)
        fleet = apply_decision(fleet, before, Decision(records[name]), now=0.0, policy=_policy())
    assert dict(fleet.pools) == dict(FleetView.of(records.values()).pools)
