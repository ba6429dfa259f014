"""The fleet-wide disruption budget (``safety.budget.fleetMaxNodes`` / ``fleetMaxPercent``):
the same rule as a pool's, over every pool together, in safety and in decide."""

from __future__ import annotations

import pytest

from gpufleet.domain import events as ev
from gpufleet.domain.decide import decide
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Budget, Policy, default_policy
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.safety import Hold, budget_allows
from gpufleet.domain.states import NodeState

from .conftest import Fleet, xid

S = NodeState


def _policy(**budget: object) -> Policy:
    base = default_policy()
    b = base.safety.budget.model_copy(update=budget)
    return base.model_copy(update={"safety": base.safety.model_copy(update={"budget": b})})


def _fleet(pools: dict[str, int], policy: Policy) -> Fleet:
    recs = {
        f"{pool}-{i}": NodeRecord.new(f"{pool}-{i}", at=0.0, pool=pool, state=S.PRODUCTION)
        for pool, n in pools.items()
        for i in range(n)
    }
    return Fleet(policy, recs)


@pytest.mark.parametrize(
    ("budget", "fleet_size", "allowed"),
    [
        ({}, 1000, None),  # no fleet-wide limit: the pools' budgets alone
        ({"fleet_max_nodes": 3}, 1000, 3),
        ({"fleet_max_percent": 1.0}, 1000, 10),
        ({"fleet_max_percent": 1.0}, 40, 1),  # raised to minNodes, like a pool's
        ({"fleet_max_percent": 1.0, "min_nodes": 0}, 40, 0),
        ({"fleet_max_nodes": 0, "fleet_max_percent": 50.0}, 1000, 0),  # the lower holds
        ({"fleet_max_nodes": 50}, 20, 20),  # never more than the fleet
    ],
)
def test_fleet_allowed(budget: dict[str, object], fleet_size: int, allowed: int | None) -> None:
    assert Budget(**budget).fleet_allowed(fleet_size) == allowed  # type: ignore[arg-type]


def test_budget_allows_checks_the_pool_and_then_the_fleet() -> None:
    b = Budget(max_nodes=5, max_percent=100, fleet_max_nodes=2)
    kw = {"pool_size": 10, "config": b, "fleet_size": 30}
    assert budget_allows(out_of_service=0, fleet_out_of_service=1, **kw)  # type: ignore[arg-type]
    assert not budget_allows(out_of_service=0, fleet_out_of_service=2, **kw)  # type: ignore[arg-type]
    assert not budget_allows(out_of_service=5, fleet_out_of_service=0, **kw)  # type: ignore[arg-type]
    # Without a fleet limit the fleet's count is never looked at.
    free = Budget(max_nodes=5, max_percent=100)
    assert budget_allows(
        out_of_service=0, pool_size=10, config=free, fleet_out_of_service=10**6, fleet_size=1
    )


def test_three_pools_each_within_budget_are_held_by_the_fleet_budget() -> None:
    """Each pool may lose 5 nodes; the fleet only 2: the third fault, in a third pool whose
    own budget is untouched, is held (and kept pending) until a node is back."""
    policy = _policy(max_nodes=5, max_percent=50, fleet_max_nodes=2)
    f = _fleet({"a": 10, "b": 10, "c": 10}, policy)
    assert f.send("a-0", xid("a-0", 79, at=1), now=1).hold is None
    assert f.send("b-0", xid("b-0", 79, at=2), now=2).hold is None
    d = f.send("c-0", xid("c-0", 79, at=3), now=3)
    assert d.hold is Hold.BUDGET_EXHAUSTED
    assert "of the pool or the fleet" in d.reasons[-1]
    assert f.state("c-0") is S.PRODUCTION and f.records["c-0"].pending is not None
    assert f.view.pool("c").out_of_service == 0
    # A node of pool a comes back: the fleet has room again and the held fault proceeds.
    f.send("a-0", ev.DrainCompleted(), now=4)
    f.send("a-0", ev.StepCompleted(Step.REBOOT, succeeded=True), now=5)
    f.send("a-0", ev.ChecksCompleted(passed=True), now=6)
    assert f.state("a-0") is S.PRODUCTION
    d = f.send("c-0", ev.Tick(), now=7)
    assert d.hold is None and f.state("c-0") is S.DRAINING


def test_a_node_already_out_is_not_counted_twice_by_the_fleet_budget() -> None:
    """A node out of service moving on (draining -> remediating -> verifying) needs no room."""
    policy = _policy(max_nodes=5, max_percent=50, fleet_max_nodes=1)
    f = _fleet({"a": 4, "b": 4}, policy)
    f.send("a-0", xid("a-0", 79, at=1), now=1)
    assert f.send("a-0", ev.DrainCompleted(), now=2).hold is None
    assert f.send("a-0", ev.StepCompleted(Step.REBOOT, succeeded=True), now=3).hold is None
    assert f.state("a-0") is S.VERIFYING


def test_fleet_percent_counts_every_pool() -> None:
    # 4 pools of 25: fleetMaxPercent 2 of 100 nodes = 2 (each pool alone would allow 12).
    policy = _policy(max_nodes=50, max_percent=50, fleet_max_percent=2.0)
    f = _fleet({p: 25 for p in "abcd"}, policy)
    holds = [f.send(f"{p}-0", xid(f"{p}-0", 79, at=i), now=i).hold for i, p in enumerate("abcd")]
    assert holds == [None, None, Hold.BUDGET_EXHAUSTED, Hold.BUDGET_EXHAUSTED]


def test_decide_reads_the_fleet_from_the_view_it_is_given() -> None:
    """Pure: the same record and event against two views, one with the fleet full."""
    policy = _policy(fleet_max_nodes=1)
    busy = NodeRecord.new("x-0", at=0.0, pool="x", state=S.DRAINING)
    idle = [NodeRecord.new(f"y-{i}", at=0.0, pool="y", state=S.PRODUCTION) for i in range(9)]
    me = NodeRecord.new("y-9", at=0.0, pool="y", state=S.PRODUCTION)
    full = FleetView.of([busy, *idle, me])
    empty = FleetView.of([*idle, me])
    event = xid("y-9", 79, at=1)
    assert decide(me, full, event, policy, 1).hold is Hold.BUDGET_EXHAUSTED
    assert decide(me, empty, event, policy, 1).hold is None
