"""A node group's own k per NVLink domain (decision 0243): an override's
``budget.perDomain.maxNodes`` holds the domains of its nodes in place of the fleet's k, on
top of the pool's, the fleet's and the group's budgets; explain names it, the status and
the deterministic simulation's invariant 4 count each domain at the k of its nodes."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import yaml

from gpufleet.domain import events as ev
from gpufleet.domain import policy_groups
from gpufleet.domain.decide import decide
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.explain import explain_node
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.policy import Policy, load_policy
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.safety import Hold
from gpufleet.domain.states import NodeState

DOMAIN = "network.topology.nvidia.com/accelerator"
RACK = "example.com/rack-kind"


def _policy(group_k: int | None = 3, fleet_k: int = 1) -> Policy:
    spec: dict[str, Any] = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec["safety"]["budget"].update(
        {"maxNodes": 50, "maxPercent": 100, "perDomain": {"maxNodes": fleet_k}}
    )
    budget: dict[str, Any] = {} if group_k is None else {"perDomain": {"maxNodes": group_k}}
    spec["overrides"] = [
        {"name": "nvl72", "nodeSelector": {"matchLabels": {RACK: "nvl72"}}, "budget": budget}
    ]
    return load_policy(json.dumps(spec))


def _fleet(out: int) -> tuple[FleetView, dict[str, NodeRecord]]:
    """Domain big (group nvl72) and domain small (no group), ``out`` trays of each out."""
    records: dict[str, NodeRecord] = {}
    for d, group in (("big", "nvl72"), ("small", "")):
        for i in range(18):
            state = NodeState.DRAINING if i < out else NodeState.PRODUCTION
            rec = NodeRecord.new(f"{d}-{i}", at=0.0, pool="gb200", state=state)
            records[rec.name] = replace(rec, nvlink_domain=d, group=group)
    return FleetView.of(records.values()), records


def _fault(node: str) -> ev.FaultObserved:
    return ev.FaultObserved(
        FaultEvent(FaultKind.XID, node, at=1.0, xid=48, evidence=Evidence(gpu_index=0))
    )


def test_the_groups_k_holds_its_domains_and_the_fleets_the_others() -> None:
    policy = _policy(group_k=3, fleet_k=1)
    big = policy_groups.for_group(policy, "nvl72")
    assert big.domain_budget is not None and big.domain_budget.max_nodes == 3
    assert big.domain_budget.label == DOMAIN  # the fleet's label, always
    fleet, records = _fleet(out=1)
    # A second tray of the group's domain goes (k 3); of the other domain it waits (k 1).
    d = decide(records["big-5"], fleet, _fault("big-5"), big, 2.0)
    assert d.hold is None and d.record.state is NodeState.DRAINING
    d = decide(records["small-5"], fleet, _fault("small-5"), policy, 2.0)
    assert d.hold is Hold.BUDGET_EXHAUSTED
    fleet, records = _fleet(out=3)
    d = decide(records["big-5"], fleet, _fault("big-5"), big, 2.0)
    assert d.hold is Hold.BUDGET_EXHAUSTED
    assert d.reasons[-1].endswith("NVLink domain big is used up (3 of at most 3 out)")


def test_a_group_k_may_be_tighter_too() -> None:
    policy = _policy(group_k=0, fleet_k=2)
    fleet, records = _fleet(out=0)
    big = policy_groups.for_group(policy, "nvl72")
    assert decide(records["big-0"], fleet, _fault("big-0"), big, 2.0).hold is (
        Hold.BUDGET_EXHAUSTED
    )
    assert decide(records["small-0"], fleet, _fault("small-0"), policy, 2.0).hold is None


def test_a_group_without_its_own_k_keeps_the_fleets() -> None:
    policy = _policy(group_k=None, fleet_k=2)
    assert policy_groups.domain_k(policy, "nvl72") == 2
    assert policy_groups.domain_limits(policy, [("big", "nvl72")]) == {}
    assert not any("changes nothing" in w for w in _policy(group_k=5).warnings())


def test_each_domain_is_counted_at_the_strictest_k_of_its_nodes() -> None:
    policy = _policy(group_k=3, fleet_k=1)
    limits = policy_groups.domain_limits(
        policy, [("big", "nvl72"), ("big", "nvl72"), ("mixed", "nvl72"), ("mixed", ""), ("", "")]
    )
    assert limits == {"big": 3, "mixed": 1}


def test_explain_names_the_groups_k() -> None:
    policy = _policy(group_k=3, fleet_k=1)
    lines = explain_node(policy, {RACK: "nvl72", DOMAIN: "big"}, node="big-1").budgets
    assert lines[-1] == (
        "NVLink domain big budget: at most 3 nodes of one NVLink domain out at once "
        "(group nvl72's own k, in place of the fleet's 1), on top of the above"
    )
    lines = explain_node(policy, {DOMAIN: "small"}, node="small-1").budgets
    assert lines[-1] == (
        "NVLink domain small budget: at most 1 nodes of one NVLink domain out at once, "
        "on top of the above"
    )
