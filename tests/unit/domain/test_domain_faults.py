"""Fabric faults judged at the scale of their NVLink domain (decision 0240): several trays of
one domain (or one tray's switch-side fault) make the domain faulty, its trays are taken out
as one and held with no ladder step, the domain returns through verification once its fabric
reports healthy; one tray's own fabric fault keeps the per-node path after the window."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import yaml

from gpufleet.domain import domain_faults, slurm_sync
from gpufleet.domain import events as ev
from gpufleet.domain.actions import ActionKind
from gpufleet.domain.decide import decide
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.domain_faults import Tray, judge
from gpufleet.domain.explain import explain
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import DomainFaults, Policy, PolicyError, load_policy
from gpufleet.domain.records import FleetView, Incident, NodeRecord, Occurrence
from gpufleet.domain.safety import BreakerState, Hold
from gpufleet.domain.states import NodeState

S = NodeState
RULE = DomainFaults()
DEGRADED = "fabric-degraded"


def _load(**changes: Any) -> Policy:
    spec: dict[str, Any] = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec["safety"]["budget"].update({"maxNodes": 50, "maxPercent": 100})
    spec["safety"]["breaker"] = {"maxNodes": 50, "maxPercent": 100, "minNodes": 20}
    for key, value in changes.items():
        spec[key] = value
    return load_policy(json.dumps(spec))


def _tray(name: str, *, at: float | None = None, key: str = DEGRADED, **kw: Any) -> Tray:
    """A production tray of domain ``a``; ``at``: it reports ``key`` raised then."""
    record = NodeRecord.new(name, at=0.0, state=S.PRODUCTION)
    record = replace(record, nvlink_domain="a", **kw)
    if at is None:
        return Tray(record)
    occ = (Occurrence(key=key, scope="gpu0", at=at),)
    return Tray(replace(record, occurrences=occ), frozenset({key}))


def _fault(name: str, kind: FaultKind, at: float) -> ev.FaultObserved:
    return ev.FaultObserved(FaultEvent(kind, name, at, evidence=Evidence(gpu_index=0)))


def _view(*records: NodeRecord, breaker: BreakerState | None = None) -> FleetView:
    return FleetView.of(records, breaker=breaker)


def test_trays_reporting_together_make_the_domain_faulty() -> None:
    trays = [_tray("t0", at=100), _tray("t1", at=130), _tray("t2", at=150), _tray("t3")]
    v = judge("a", trays, RULE, now=160)
    assert v.faulty and v.reporting == ("t0", "t1", "t2")
    assert v.take == ("t0", "t1", "t2", "t3")  # the healthy tray's jobs span the domain too
    assert "3 of 4 trays report a fabric fault within 120s" in v.why
    assert v.release == ()


def test_one_tray_alone_or_reports_too_far_apart_are_the_trays_own() -> None:
    alone = judge("a", [_tray("t0", at=100), _tray("t1"), _tray("t2")], RULE, now=110)
    assert not alone.faulty and alone.take == () and alone.why == ""
    # The first report is older than the window: each is judged on its own.
    apart = judge("a", [_tray("t0", at=100), _tray("t1", at=300)], RULE, now=300)
    assert not apart.faulty


def test_a_switch_side_fault_on_one_tray_is_the_domains() -> None:
    trays = [_tray("t0", at=100, key="nvswitch-fatal"), _tray("t1")]
    v = judge("a", trays, RULE, now=100)
    assert v.faulty and v.switch == ("t0",) and v.take == ("t0", "t1")
    assert "switch side" in v.why


def test_a_fault_the_rule_does_not_count_makes_nothing() -> None:
    trays = [_tray("t0", at=100, key="nvswitch-nonfatal"), _tray("t1", at=100, key="xid-79")]
    assert not judge("a", trays, RULE, now=101).faulty
    off = DomainFaults(min_trays=0)
    assert not judge("a", [_tray("t0", at=1), _tray("t1", at=1)], off, now=2).faulty


def test_a_held_domain_stays_held_while_a_tray_reports_and_is_released_when_none_does() -> None:
    hold = domain_faults.description("a", "x")
    inc = Incident(key=domain_faults.KEY, description=hold, opened_at=1.0, plan=None)
    held = [_tray(f"t{i}", state=S.DRAINING, incident=inc).record for i in range(3)]
    # Long after the window, one tray still reports: still faulty, nothing new to take.
    still = [Tray(held[0], frozenset({DEGRADED})), Tray(held[1]), Tray(held[2])]
    v = judge("a", still, RULE, now=10_000)
    assert v.faulty and v.take == () and v.release == () and v.held == ("t0", "t1", "t2")
    healthy = judge("a", [Tray(r) for r in held], RULE, now=10_000)
    assert not healthy.faulty and healthy.release == ("t0", "t1", "t2")


def test_a_domain_fault_takes_a_production_tray_out_and_holds_it_with_no_ladder_step() -> None:
    policy = _load()
    tray = _tray("t3").record
    d = decide(tray, _view(tray), ev.DomainFaulted("a", "3 of 4 trays"), policy, now=200)
    assert d.record.state is S.DRAINING and domain_faults.held(d.record.incident)
    kinds = [a.kind for a in d.actions]
    assert kinds == [ActionKind.CORDON, ActionKind.TAINT, ActionKind.DRAIN]
    assert "NVLink domain a faulty" in d.actions[0].detail
    drained = decide(d.record, _view(d.record), ev.DrainCompleted(), policy, now=210)
    assert drained.record.state is S.DRAINING and drained.actions == ()
    assert any("held with NVLink domain a" in r for r in drained.reasons)
    later = decide(drained.record, _view(drained.record), ev.Tick(), policy, now=5000)
    assert later.actions == () and later.record.state is S.DRAINING


def test_a_tray_draining_for_its_own_fabric_fault_joins_its_domain() -> None:
    policy = _load()
    tray = _tray("t0").record
    faulted = decide(tray, _view(tray), _fault("t0", FaultKind.FABRIC_DEGRADED, 100), policy, 100)
    assert faulted.record.state is S.DRAINING and faulted.record.incident is not None
    joined = decide(
        faulted.record, _view(faulted.record), ev.DomainFaulted("a", "why"), policy, now=101
    )
    assert domain_faults.held(joined.record.incident)
    assert [a.kind for a in joined.actions] == [ActionKind.NOTIFY]
    assert (
        "fabric-degraded on this tray is handled with NVLink domain a" in joined.actions[0].detail
    )
    drained = decide(joined.record, _view(joined.record), ev.DrainCompleted(), policy, now=500)
    assert not any(a.kind is ActionKind.RUN_STEP for a in drained.actions)


def test_a_trays_own_fabric_fault_waits_the_window_then_walks_its_ladder() -> None:
    policy = _load()
    tray = _tray("t0").record
    faulted = decide(tray, _view(tray), _fault("t0", FaultKind.FABRIC_DEGRADED, 100), policy, 100)
    drained = decide(faulted.record, _view(faulted.record), ev.DrainCompleted(), policy, now=130)
    assert drained.record.state is S.DRAINING and not drained.actions
    assert any("waits 90s more for other trays of NVLink domain a" in r for r in drained.reasons)
    after = decide(drained.record, _view(drained.record), ev.Tick(), policy, now=221)
    assert after.record.state is S.REMEDIATING
    assert [a.step for a in after.actions if a.kind is ActionKind.RUN_STEP] == [Step.REBOOT]


def test_a_node_in_no_domain_never_waits() -> None:
    policy = _load()
    node = replace(_tray("n").record, nvlink_domain="")
    faulted = decide(node, _view(node), _fault("n", FaultKind.FABRIC_DEGRADED, 100), policy, 100)
    drained = decide(faulted.record, _view(faulted.record), ev.DrainCompleted(), policy, now=101)
    assert drained.record.state is S.REMEDIATING


def test_the_domains_own_budget_does_not_hold_it_the_pools_and_the_breaker_do() -> None:
    spec: dict[str, Any] = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec["safety"]["budget"].update(
        {"maxNodes": 50, "maxPercent": 100, "perDomain": {"maxNodes": 1}}
    )
    spec["safety"]["breaker"] = {"maxNodes": 50, "maxPercent": 100, "minNodes": 20}
    per_domain = load_policy(json.dumps(spec))
    out = replace(_tray("t0").record, state=S.DRAINING)
    tray = _tray("t1").record
    view = _view(out, tray)
    d = decide(tray, view, ev.DomainFaulted("a", "why"), per_domain, now=10)
    assert d.hold is None and d.record.state is S.DRAINING
    spec["safety"]["budget"].update({"maxNodes": 1, "maxPercent": 0, "minNodes": 1})
    pool_full = load_policy(json.dumps(spec))
    held = decide(tray, view, ev.DomainFaulted("a", "why"), pool_full, now=10)
    assert held.hold is Hold.BUDGET_EXHAUSTED and held.record.state is S.PRODUCTION
    breaker = BreakerState(tripped_at=5.0, last_fault_at=9.0)
    tripped = decide(
        tray, _view(out, tray, breaker=breaker), ev.DomainFaulted("a", "w"), per_domain, 10
    )
    assert tripped.hold is Hold.BREAKER_OPEN


def test_pause_and_dry_run_hold_a_domain_fault() -> None:
    tray = _tray("t1").record
    for policy in (_load(paused=True), _load(dryRun=True)):
        d = decide(tray, _view(tray), ev.DomainFaulted("a", "why"), policy, now=10)
        assert d.hold in (Hold.PAUSED, Hold.DRY_RUN) and d.record.state is S.PRODUCTION


def test_a_repaired_domain_verifies_each_tray_and_a_failed_one_walks_its_own_ladder() -> None:
    policy = _load()
    tray = _tray("t0").record
    held = decide(tray, _view(tray), ev.DomainFaulted("a", "why"), policy, now=10).record
    held = decide(held, _view(held), ev.DrainCompleted(), policy, now=20).record
    back = decide(held, _view(held), ev.DomainRepaired("a", "healthy again"), policy, now=30)
    assert back.record.state is S.VERIFYING
    assert ActionKind.RUN_CHECKS in [a.kind for a in back.actions]
    passed = decide(back.record, _view(back.record), ev.ChecksCompleted(True), policy, now=40)
    assert passed.record.state is S.PRODUCTION
    failed = decide(back.record, _view(back.record), ev.ChecksCompleted(False), policy, now=40)
    assert failed.record.state is S.REMEDIATING
    assert [a.step for a in failed.actions if a.kind is ActionKind.RUN_STEP] == [
        policy.first_step()
    ]


def test_a_step_under_way_ends_and_none_starts_after_it() -> None:
    policy = _load()
    tray = _tray("t0").record
    r = decide(tray, _view(tray), _fault("t0", FaultKind.FABRIC_DEGRADED, 100), policy, 100).record
    r = decide(r, _view(r), ev.DrainCompleted(), policy, now=300).record
    assert r.state is S.REMEDIATING and r.incident is not None and r.incident.current is not None
    step = r.incident.current
    r = decide(r, _view(r), ev.DomainFaulted("a", "why"), policy, now=301).record
    failed = decide(r, _view(r), ev.StepCompleted(step, False), policy, now=302)
    assert failed.record.state is S.REMEDIATING and failed.actions == ()
    assert failed.record.incident is not None and failed.record.incident.current is None
    tick = decide(failed.record, _view(failed.record), ev.Tick(), policy, now=303)
    assert not any(a.kind is ActionKind.RUN_STEP for a in tick.actions)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"minTrays": -1}, "greater than or equal to 0"),
        ({"faults": ["xid"]}, "is not a fault of the NVLink fabric"),
        ({"switchFaults": ["ib-port-down"]}, "is not a fault of the NVLink fabric"),
        ({"windowSeconds": 0}, "greater than 0"),
    ],
)
def test_a_bad_rule_is_refused(rule: dict[str, Any], expected: str) -> None:
    with pytest.raises(PolicyError, match=expected):
        _load(domainFaults=rule)


def test_a_group_may_not_set_the_rule() -> None:
    spec: dict[str, Any] = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec["overrides"] = [
        {"name": "g", "nodeSelector": {"matchLabels": {"a": "b"}}, "domainFaults": {}}
    ]
    with pytest.raises(PolicyError, match="may not be set per node group"):
        load_policy(json.dumps(spec))


def test_the_slurm_drain_reason_names_the_held_domain_first() -> None:
    view = slurm_sync.KubeView(state=S.DRAINING, managed=True, domain_held="nvl-a")
    assert slurm_sync.out_reason(view) == "nvlink domain nvl-a faulty"
    reporting = replace(view, problems=(("FabricProblem", "FabricDegraded"),))
    assert slurm_sync.out_reason(reporting) == (
        "nvlink domain nvl-a faulty: FabricProblem FabricDegraded"
    )
    assert slurm_sync.out_reason(replace(view, domain_held="")) == "state draining"


def test_policy_explain_names_the_rule_for_a_fabric_fault_and_not_for_others() -> None:
    policy = _load()
    lines = explain(policy, fault=FaultKind.FABRIC_DEGRADED).isolation
    assert any("with 1 more tray(s) of its NVLink domain within 120s" in x for x in lines)
    switch = explain(policy, fault=FaultKind.NVSWITCH_FATAL).isolation
    assert any("one tray's report makes its NVLink domain faulty" in x for x in switch)
    assert not any("domainFaults" in x for x in explain(policy, xid=79).isolation)
    off = _load(domainFaults={"minTrays": 0})
    assert not any(
        "domainFaults" in x for x in explain(off, fault=FaultKind.FABRIC_DEGRADED).isolation
    )


def test_policy_explain_node_says_how_a_trays_fabric_faults_are_judged() -> None:
    from gpufleet.domain.explain import explain_node

    labels = {"network.topology.nvidia.com/accelerator": "nvl-7"}
    found = explain_node(_load(), labels, node="t0")
    assert (
        found.domain_faults and "NVLink domain nvl-7: 2 trays reporting" in found.domain_faults[0]
    )
    assert "or one tray's nvswitch-fatal" in found.domain_faults[0]
    assert explain_node(_load(), {}, node="t0").domain_faults == []
    off = _load(domainFaults={"minTrays": 0})
    assert explain_node(off, labels, node="t0").domain_faults == []
