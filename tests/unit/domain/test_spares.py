"""Hot spares: how many a pool keeps, who becomes one, who is promoted, through decide()."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import events as ev
from gpufleet.domain import spares
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy, Spares, default_policy
from gpufleet.domain.records import FleetView, NodeRecord, record_from_json, record_to_json
from gpufleet.domain.states import NodeState

from .conftest import Fleet, make_fleet, xid

S = NodeState


def _policy(**kw: object) -> Policy:
    return default_policy().model_copy(update={"spares": Spares(**kw)})  # type: ignore[arg-type]


def _repair(f: Fleet, node: str, t: float) -> None:
    f.send(node, xid(node, 79, at=t), now=t)
    f.send(node, ev.DrainCompleted(), now=t + 1)
    f.send(node, ev.StepCompleted(Step.REBOOT, succeeded=True), now=t + 2)
    f.send(node, ev.ChecksCompleted(passed=True), now=t + 3)


def test_wanted_per_pool_size() -> None:
    s = Spares()
    assert [s.wanted(n) for n in (1, 4, 99, 100, 438, 10_000)] == [0, 0, 0, 1, 4, 50]
    assert Spares(percent=0, min_nodes=1).wanted(4) == 1
    assert Spares(percent=100, min_nodes=0).wanted(4) == 3  # never the whole pool
    assert Spares(percent=0, min_nodes=5).wanted(1) == 0


@given(st.integers(0, 5000), st.floats(0, 100), st.integers(0, 60), st.integers(0, 60))
def test_wanted_is_bounded(size: int, percent: float, lo: int, hi: int) -> None:
    n = Spares(percent=percent, min_nodes=lo, max_nodes=hi).wanted(size)
    assert 0 <= n <= max(0, size - 1) and n <= hi


def test_a_repaired_node_becomes_a_spare_while_the_pool_is_short() -> None:
    f = make_fleet(4, _policy(percent=0, min_nodes=1))
    _repair(f, "n1", 0.0)
    assert f.state("n1") is S.PRODUCTION and f.records["n1"].is_spare
    assert any("kept as a hot spare (1 of 1" in r for r in f.log[-1][1].reasons)
    assert f.view.pool("default").spares == 1
    _repair(f, "n2", 100.0)  # the pool already has its spare: n2 serves again
    assert not f.records["n2"].spare


def test_a_spare_is_promoted_when_a_node_leaves_production() -> None:
    f = make_fleet(4, _policy(percent=0, min_nodes=1))
    _repair(f, "n1", 0.0)
    assert spares.promotions(f.records.values(), f.policy) == ()  # 3 serve: capacity 4 - 1
    f.send("n2", xid("n2", 79, at=50.0), now=50.0)
    assert spares.promotions(f.records.values(), f.policy) == ("n1",)
    d = f.send("n1", ev.SparePromoted("n2 left production"), now=51.0)
    assert not f.records["n1"].spare and f.state("n1") is S.PRODUCTION
    assert d.transition is None and "promoted from the spare pool" in d.reasons[0]
    assert f.view.pool("default").spares == 0
    assert spares.promotions(f.records.values(), f.policy) == ()
    # n2 comes back repaired: the pool is short again, so it waits as the spare.
    f.send("n2", ev.DrainCompleted(), now=52.0)
    f.send("n2", ev.StepCompleted(Step.REBOOT, succeeded=True), now=53.0)
    f.send("n2", ev.ChecksCompleted(passed=True), now=54.0)
    assert f.records["n2"].is_spare


def test_a_spare_that_faults_leaves_the_pool() -> None:
    f = make_fleet(4, _policy(percent=0, min_nodes=1))
    _repair(f, "n1", 0.0)
    f.send("n1", xid("n1", 79, at=50.0, gpu=1), now=50.0)
    assert f.state("n1") is S.DRAINING and not f.records["n1"].spare
    assert f.view.pool("default").spares == 0


def test_promotion_is_held_when_paused_and_ignored_for_a_non_spare() -> None:
    f = make_fleet(4, _policy(percent=0, min_nodes=1))
    _repair(f, "n1", 0.0)
    f.policy = f.policy.model_copy(update={"paused": True})
    d = f.send("n1", ev.SparePromoted("n2 left"), now=60.0)
    assert f.records["n1"].is_spare and "paused" in d.reasons[0]
    d = f.send("n0", ev.SparePromoted("n2 left"), now=61.0)
    assert "not a spare" in d.reasons[0]


def test_no_spares_wanted_promotes_every_spare() -> None:
    recs = [
        replace(NodeRecord.new(f"n{i}", at=0.0, state=S.PRODUCTION), spare=i < 2) for i in range(4)
    ]
    assert spares.promotions(recs, _policy(percent=0, min_nodes=0)) == ("n0", "n1")


def test_pools_are_counted_apart() -> None:
    a = [NodeRecord.new(f"a{i}", at=0.0, pool="a", state=S.PRODUCTION) for i in range(3)]
    b = [
        replace(NodeRecord.new(f"b{i}", at=0.0, pool="b", state=S.PRODUCTION), spare=i == 0)
        for i in range(3)
    ]
    b[1] = replace(b[1], state=S.DRAINING)
    view = FleetView.of([*a, *b])
    assert view.pool("b").spares == 1 and view.pool("a").spares == 0
    assert spares.promotions([*a, *b], _policy(percent=0, min_nodes=1)) == ("b0",)


def test_the_spare_mark_survives_the_stored_record() -> None:
    rec = replace(NodeRecord.new("n1", at=0.0, state=S.PRODUCTION), spare=True)
    assert record_from_json(record_to_json(rec)).is_spare
