"""A tray of an NVLink domain with no tray in production returns only after its node checks
AND the domain's burn-in passed, when the policy asks for it (decision 0247); a tray the
domain burn-in names goes to its own failed-checks path, the others stay held."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import yaml

from gpufleet.domain import events as ev
from gpufleet.domain.decide import decide
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.policy import Policy, PolicyError, load_policy
from gpufleet.domain.records import FleetView, NodeRecord, record_from_json, record_to_json
from gpufleet.domain.states import NodeState

S = NodeState
DOMAIN = "nvl-7"


def _policy(required: bool = True, per_domain: bool = True) -> Policy:
    spec: dict[str, Any] = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec["safety"]["budget"].update({"maxNodes": 50, "maxPercent": 100})
    if per_domain:
        spec["safety"]["budget"]["perDomain"] = {"maxNodes": 4}
    spec.setdefault("checks", {})["domainBurnIn"] = {"required": required}
    return load_policy(json.dumps(spec))


def _tray(name: str, state: NodeState, domain: str = DOMAIN) -> NodeRecord:
    r = NodeRecord.new(name, at=0.0, pool="gb200", state=state)
    return replace(r, nvlink_domain=domain, checks_started_at=5.0)


def _domain(*states: NodeState) -> tuple[FleetView, list[NodeRecord]]:
    trays = [_tray(f"t{i}", s) for i, s in enumerate(states)]
    return FleetView.of(trays), trays


def test_a_new_domain_waits_for_its_burn_in_after_the_node_checks() -> None:
    fleet, trays = _domain(S.BURN_IN, S.BURN_IN, S.VERIFYING)
    d = decide(trays[0], fleet, ev.ChecksCompleted(passed=True), _policy(), 10.0)
    assert d.record.state is S.BURN_IN and not d.changed
    assert d.record.domain_wait == 10.0 and d.record.checks_started_at is None
    assert f"waiting for the burn-in of NVLink domain {DOMAIN}" in d.record.reason
    # the wait is kept with the record, and no burn-in timeout fails it meanwhile
    assert record_from_json(record_to_json(d.record)).domain_wait == 10.0
    tick = decide(d.record, fleet, ev.Tick(), _policy(), 10.0 + 5 * 3600)
    assert tick.record.state is S.BURN_IN and not tick.changed


def test_a_passed_verdict_kept_after_the_wait_returns_the_tray() -> None:
    fleet, trays = _domain(S.BURN_IN, S.BURN_IN, S.BURN_IN)
    waiting = decide(trays[0], fleet, ev.ChecksCompleted(passed=True), _policy(), 10.0).record
    old = ev.DomainBurnInJudged(DOMAIN, True, 9.0, "passed earlier")
    assert decide(waiting, fleet, old, _policy(), 20.0).record.state is S.BURN_IN
    other = ev.DomainBurnInJudged("nvl-8", True, 15.0, "another domain")
    assert decide(waiting, fleet, other, _policy(), 20.0).record.state is S.BURN_IN
    d = decide(waiting, fleet, ev.DomainBurnInJudged(DOMAIN, True, 15.0, "ok"), _policy(), 20.0)
    assert d.record.state is S.PRODUCTION and d.record.domain_wait is None
    assert "node checks and the burn-in of NVLink domain nvl-7 passed" in d.record.reason


def test_a_tray_named_bad_fails_its_own_checks_and_the_others_stay_held() -> None:
    fleet, trays = _domain(S.BURN_IN, S.VERIFYING, S.BURN_IN)
    policy = _policy()
    waiting = [decide(t, fleet, ev.ChecksCompleted(True), policy, 10.0).record for t in trays]
    failed = ev.DomainBurnInJudged(DOMAIN, False, 15.0, "tray t1 is slow", ("t1", "t0"))
    new = decide(waiting[0], fleet, failed, policy, 20.0)
    assert new.record.state is S.TRIAGE and "named bad by the burn-in" in new.record.reason
    verifying = decide(waiting[1], fleet, failed, policy, 20.0)
    assert verifying.record.state in (S.REMEDIATING, S.DRAINING, S.TRIAGE)
    assert "verification failed: named bad" in " ".join(verifying.reasons)
    held = decide(waiting[2], fleet, failed, policy, 20.0)
    assert held.record.state is S.BURN_IN and held.record.domain_wait == 15.0
    assert "held: the burn-in of NVLink domain nvl-7 failed: tray t1 is slow" in held.record.reason
    # the same verdict again changes nothing; a later passing run returns it
    again = decide(held.record, fleet, failed, policy, 25.0)
    assert again.record == held.record or again.record.state is S.BURN_IN
    ok = ev.DomainBurnInJudged(DOMAIN, True, 30.0, "passed")
    assert decide(held.record, fleet, ok, policy, 31.0).record.state is S.PRODUCTION


@pytest.mark.parametrize(
    ("states", "policy", "why"),
    [
        ((S.BURN_IN, S.PRODUCTION, S.PRODUCTION), _policy(), "its domain keeps working"),
        ((S.BURN_IN, S.BURN_IN), _policy(required=False), "the policy does not ask"),
        ((S.BURN_IN,), _policy(), "a domain of one tray"),
    ],
)
def test_otherwise_the_node_checks_alone_return_the_tray(
    states: tuple[NodeState, ...], policy: Policy, why: str
) -> None:
    fleet, trays = _domain(*states)
    d = decide(trays[0], fleet, ev.ChecksCompleted(passed=True), policy, 10.0)
    assert d.record.state is S.PRODUCTION, why


def test_a_tray_that_moves_stops_waiting() -> None:
    fleet, trays = _domain(S.BURN_IN, S.BURN_IN)
    waiting = decide(trays[0], fleet, ev.ChecksCompleted(True), _policy(), 10.0).record
    triaged = decide(waiting, fleet, ev.OperatorTriage("look at it"), _policy(), 12.0).record
    assert triaged.state is S.TRIAGE and triaged.domain_wait is None


def test_the_fleet_view_counts_the_trays_in_burn_in_or_verifying_as_records_change() -> None:
    fleet, trays = _domain(S.BURN_IN, S.PRODUCTION, S.VERIFYING)
    assert fleet.domains_checking == {DOMAIN: 2}
    moved = replace(trays[1], state=S.VERIFYING)
    after = fleet.with_change(trays[1], moved)
    assert after.domains_checking == {DOMAIN: 3}
    assert after.domains_checking == FleetView.of([trays[0], moved, trays[2]]).domains_checking
    gone = after.with_change(moved, replace(moved, state=S.PRODUCTION))
    assert gone.domains_checking == {DOMAIN: 2}


def test_the_policy_needs_the_domain_label_of_the_per_domain_budget() -> None:
    with pytest.raises(PolicyError, match=r"checks\.domainBurnIn\.required: needs safety"):
        _policy(per_domain=False)
