"""Invariants of the decision core under arbitrary event sequences (hypothesis)."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import events as ev
from gpufleet.domain import xids
from gpufleet.domain.actions import ActionKind
from gpufleet.domain.decide import decide
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Breaker, Policy, Response, default_policy, load_policy
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.safety import BreakerState, breaker_observe, breaker_refresh
from gpufleet.domain.states import OUT_OF_SERVICE, NodeState, is_legal

from .conftest import Fleet

NON_XID = [k for k in FaultKind if k is not FaultKind.XID]
XID_CODES = sorted(xids.XIDS)

fault_events = st.builds(
    lambda kind, code, gpu, hca, ra: FaultEvent(
        kind,
        "?",
        at=0.0,
        xid=code if kind is FaultKind.XID else None,
        evidence=Evidence(gpu_index=gpu, hca=hca, port=1 if hca else None, recovery_action=ra),
    ),
    st.sampled_from([FaultKind.XID] * 3 + NON_XID),
    st.sampled_from([*XID_CODES, 7, 500]),
    st.none() | st.integers(0, 7),
    st.none() | st.sampled_from(["mlx5_0", "mlx5_1"]),
    st.none() | st.sampled_from(["gpu-reset", "node-reboot", "drain-and-reset", "bogus"]),
)

events = st.one_of(
    fault_events.map(ev.FaultObserved),
    st.sampled_from(["xid-79", "ib-port-down", "xid-13"]).map(ev.FaultCleared),
    st.just(ev.DrainCompleted()),
    st.builds(ev.StepCompleted, st.sampled_from(list(Step)), st.booleans()),
    st.builds(ev.ChecksCompleted, st.booleans()),
    st.just(ev.Registered()),
    st.just(ev.InventoryMismatch("mismatch")),
    st.just(ev.MaintenanceRequested("maintenance")),
    st.just(ev.MaintenanceCompleted("done")),
    st.just(ev.OperatorReturn("fixed")),
    st.just(ev.OperatorRMA("dead")),
    st.just(ev.OperatorTriage("by alice: look at it")),
    st.just(ev.OperatorDismiss("by alice: known flake")),
    st.just(ev.HardwareReplaced("new board")),
    st.just(ev.Tick()),
)


def _policy(max_nodes: int, max_percent: float, breaker_nodes: int, rate: int) -> Policy:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data["safety"] = {
        "budget": {"maxNodes": max_nodes, "maxPercent": max_percent, "minNodes": 1},
        "breaker": {"maxNodes": breaker_nodes, "maxPercent": 50, "minNodes": 1,
                    "windowSeconds": 600, "cooldownSeconds": 900},
        "rateLimit": {"maxActions": rate, "windowSeconds": 300},
    }  # fmt: skip
    return load_policy(yaml.safe_dump(data))


policies = st.builds(
    _policy,
    st.integers(0, 4),
    st.floats(0, 60),
    st.integers(1, 6),
    st.integers(1, 10),
)

initial_states = st.lists(
    st.sampled_from([NodeState.PRODUCTION] * 4 + [NodeState.PROVISIONING]),
    min_size=2,
    max_size=12,
)

steps = st.lists(st.tuples(st.integers(0, 11), events, st.floats(0, 900)), min_size=1, max_size=120)


def _with_node(e: ev.Event, node: str, now: float) -> ev.Event:
    if isinstance(e, ev.FaultObserved):
        f = e.fault
        return ev.FaultObserved(FaultEvent(f.kind, node, at=now, xid=f.xid, evidence=f.evidence))
    return e


@settings(max_examples=150, deadline=None)
@given(policy=policies, states=initial_states, script=steps)
def test_no_illegal_transition_and_budget_never_exceeded(
    policy: Policy, states: list[NodeState], script: list[tuple[int, ev.Event, float]]
) -> None:
    pools = ["a", "b"]
    records = {
        f"n{i}": NodeRecord.new(f"n{i}", at=0.0, pool=pools[i % 2], state=s)
        for i, s in enumerate(states)
    }
    fleet = Fleet(policy, records)
    now = 0.0
    for idx, event, dt in script:
        node = f"n{idx % len(states)}"
        now += dt
        before = fleet.records[node]
        d = fleet.send(node, _with_node(event, node, now), now)
        t = d.transition
        if t is not None:
            assert t.source is before.state
            assert is_legal(t.source, t.target, t.trigger)
            assert t.reason and t.at == now
            assert d.record.state is t.target
        else:
            assert d.record.state is before.state
        if d.hold is not None:
            # Held: nothing acts on the node; a Notice may name a held fault another
            # held fault now stands for (a held fault is never dropped silently).
            assert all(a.kind is ActionKind.NOTIFY for a in d.actions), d.actions
        for pool in pools:
            members = [r for r in fleet.records.values() if r.pool == pool]
            out = sum(1 for r in members if r.state in OUT_OF_SERVICE)
            allowed = policy.safety.budget.allowed(len(members))
            # A pool may start over budget only through nodes that were already out.
            assert out <= max(allowed, 0), (pool, out, allowed)
        # The incremental fleet view agrees with a recount.
        recount = fleet.view.of(fleet.records.values())
        assert dict(recount.pools) == dict(fleet.view.pools)


@settings(max_examples=100, deadline=None)
@given(
    record_state=st.sampled_from(list(NodeState)),
    event=events,
    now=st.floats(0, 1e6),
)
def test_same_inputs_same_decision(record_state: NodeState, event: ev.Event, now: float) -> None:
    policy = default_policy()
    rec = NodeRecord.new("n", at=0.0, state=record_state)
    fleet = Fleet(policy, {"n": rec, "m": NodeRecord.new("m", at=0.0)}).view
    e = _with_node(event, "n", now)
    assert decide(rec, fleet, e, policy, now) == decide(rec, fleet, e, policy, now)


@given(kind=st.sampled_from(NON_XID))
def test_every_fault_kind_maps_to_an_action_or_explicit_ignore(kind: FaultKind) -> None:
    rule = default_policy().rule_for(FaultEvent(kind, "n", at=0))
    assert rule.match.fault is kind
    assert isinstance(rule.action, Response)


@given(code=st.integers(1, 400))
def test_every_xid_number_maps_to_an_action(code: int) -> None:
    rule = default_policy().rule_for(FaultEvent(FaultKind.XID, "n", at=0, xid=code))
    assert isinstance(rule.action, Response)
    if code not in xids.XIDS:
        assert rule.action is default_policy().unknown_xid


@given(code=st.integers(-400, 0))
def test_xid_zero_and_negative_numbers_are_refused(code: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        FaultEvent(FaultKind.XID, "n", at=0, xid=code)


@settings(max_examples=200, deadline=None)
@given(
    faults=st.lists(st.tuples(st.integers(0, 30), st.floats(0, 400)), min_size=1, max_size=60),
    threshold=st.integers(1, 6),
)
def test_breaker_trips_and_resets_as_specified(
    faults: list[tuple[int, float]], threshold: int
) -> None:
    cfg = Breaker(max_nodes=threshold, max_percent=100, min_nodes=1,
                  window_seconds=600, cooldown_seconds=900)  # fmt: skip
    fleet_size = 1000
    state = BreakerState()
    now = 0.0
    seen: list[tuple[float, int]] = []
    for node, dt in faults:
        now += dt
        state = breaker_refresh(state, now=now, config=cfg, fleet_size=fleet_size)
        was_open = state.is_open
        state = breaker_observe(state, node=f"n{node}", now=now, config=cfg, fleet_size=fleet_size)
        seen.append((now, node))
        distinct = {n for t, n in seen if now - t < 600}
        # Trips exactly when the window holds more distinct nodes than the threshold...
        if len(distinct) > threshold:
            assert state.is_open
        elif not was_open:
            assert not state.is_open
    # ...and closes only after a quiet cooldown.
    if state.is_open:
        assert breaker_refresh(state, now=now + 899, config=cfg, fleet_size=fleet_size).is_open
        later = breaker_refresh(state, now=now + 900.001, config=cfg, fleet_size=fleet_size)
        assert not later.is_open
