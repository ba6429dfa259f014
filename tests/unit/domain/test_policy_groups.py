"""Policy per node group: selectors, first-match resolution, validation, group budgets."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpufleet.domain import events as ev
from gpufleet.domain.decide import decide
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.explain import explain_node
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy, PolicyError, Response, load_policy
from gpufleet.domain.policy_groups import for_group, group_of, policy_for
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.safety import Hold
from gpufleet.domain.selectors import LabelSelector
from gpufleet.domain.states import NodeState

POOL = "gpufleet.io/pool"


def _spec(*overrides: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec["overrides"] = list(overrides)
    return spec


def _load(*overrides: dict[str, Any]) -> Policy:
    return load_policy(json.dumps(_spec(*overrides)))


def _problems(*overrides: dict[str, Any]) -> str:
    with pytest.raises(PolicyError) as caught:
        _load(*overrides)
    return str(caught.value)


GB200 = {
    "name": "gb200",
    "nodeSelector": {"matchLabels": {POOL: "gb200"}},
    "budget": {"maxNodes": 1},
    "rules": [{"match": {"xid": 79}, "action": "reimage"}],
}
TENANT = {
    "name": "tenant-a",
    "nodeSelector": {
        "matchExpressions": [{"key": "example.com/tenant", "operator": "In", "values": ["a"]}]
    },
    "unknownXid": "reboot",
}


def _xid(n: int, node: str = "n1") -> FaultEvent:
    return FaultEvent(FaultKind.XID, node, at=1.0, xid=n, evidence=Evidence(gpu_index=0))


def test_first_match_wins_and_says_why() -> None:
    policy = _load(GB200, TENANT)
    both = {POOL: "gb200", "example.com/tenant": "a"}
    found = policy_for(policy, both)
    assert found.override == "gb200" and found.index == 0
    assert found.why[-1] == "overrides[0] (gb200) applies: the first override that matches"
    tenant = policy_for(policy, {POOL: "h100", "example.com/tenant": "a"})
    assert tenant.override == "tenant-a"
    assert "  failed: gpufleet.io/pool in (gb200): 'h100'" in tenant.why
    none = policy_for(policy, {POOL: "h100"})
    assert none.override is None and none.policy is policy
    assert none.why[-1] == "no override matches: the fleet-wide policy applies"
    assert group_of(policy, both) == "gb200" and group_of(policy, {}) == ""


def test_an_override_replaces_only_what_it_sets() -> None:
    policy = _load(GB200, TENANT)
    gb = policy_for(policy, {POOL: "gb200"}).policy
    assert gb.rule_for(_xid(79)).action is Response.REIMAGE
    assert policy.rule_for(_xid(79)).action is not Response.REIMAGE
    assert gb.rule_for(_xid(48)) == policy.rule_for(_xid(48))  # kept from the fleet
    assert gb.ladder == policy.ladder and gb.safety == policy.safety
    assert gb.group == "gb200" and gb.overrides == ()
    budget = gb.group_budget
    assert budget is not None and budget.max_nodes == 1
    assert budget.max_percent == policy.safety.budget.max_percent  # left out: the fleet's
    tenant = policy_for(policy, {"example.com/tenant": "a"}).policy
    assert tenant.unknown_xid is Response.REBOOT and tenant.group_budget is None


def test_dry_run_and_pause_stay_the_fleets() -> None:
    """Also when the policy was resolved before it was copied into dry-run (the controller's
    forced dry-run copies the policy in use): a resolution is never served to a copy."""
    policy = _load(GB200)
    first = policy_for(policy, {POOL: "gb200"}).policy
    assert not first.dry_run and policy_for(policy, {POOL: "gb200"}).policy is first
    dry = policy.model_copy(update={"dry_run": True})
    assert policy_for(dry, {POOL: "gb200"}).policy.dry_run
    assert policy_for(dry.model_copy(update={"paused": True}), {POOL: "gb200"}).policy.paused


def test_an_override_with_its_own_ladder() -> None:
    ladder = [{"step": s} for s in ("gpu-reset", "reboot", "reimage")]
    policy = _load({**GB200, "ladder": ladder})
    gb = policy_for(policy, {POOL: "gb200"}).policy
    assert for_group(policy, "gb200") is gb  # a record's group gives the same policy
    assert for_group(policy, "") is policy and for_group(policy, "gone") is policy
    assert [e.step for e in gb.ladder] == [Step.GPU_RESET, Step.REBOOT, Step.REIMAGE]
    assert gb.next_step(Step.REBOOT) is Step.REIMAGE
    assert policy.next_step(Step.REBOOT) is Step.POWER_CYCLE


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({**GB200, "breaker": {"maxNodes": 3}}, "breaker may not be set per node group"),
        ({**GB200, "dryRun": True}, "dryRun may not be set per node group"),
        ({**GB200, "budget": {"fleetMaxNodes": 3}}, "fleetMaxNodes is fleet-wide"),
        ({**GB200, "nodeSelector": {}}, "an empty nodeSelector would cover every node"),
        (
            {
                **GB200,
                "nodeSelector": {
                    "matchExpressions": [{"key": "a/b/c", "operator": "Exists"}],
                },
            },
            "at most one '/'",
        ),
        (
            {
                **GB200,
                "nodeSelector": {"matchExpressions": [{"key": "rack", "operator": "In"}]},
            },
            "operator In needs at least one value",
        ),
        (
            {
                **GB200,
                "nodeSelector": {
                    "matchLabels": {"rack": "r1"},
                    "matchExpressions": [{"key": "rack", "operator": "DoesNotExist"}],
                },
            },
            "rack must both exist and not exist",
        ),
        (
            {
                **GB200,
                "nodeSelector": {
                    "matchLabels": {"rack": "r1"},
                    "matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["r1"]}],
                },
            },
            "no value of rack meets every requirement",
        ),
        ({**GB200, "ladder": [{"step": "reimage"}]}, "lacks gpu-reset, reboot"),
        (
            {**GB200, "ladder": [{"step": "reboot"}, {"step": "reboot"}]},
            "overrides[0] (gb200).ladder[1]: reboot appears twice",
        ),
        (
            {**GB200, "rules": [{"match": {"xid": 79}, "action": "log"}] * 2},
            "overrides[0] (gb200).rules[1]: a second rule for xid-79",
        ),
    ],
)
def test_a_bad_override_is_refused_clearly(override: dict[str, Any], expected: str) -> None:
    assert expected in _problems(override)


def test_conflicting_overrides_are_refused() -> None:
    assert "the name is taken by overrides[0]" in _problems(GB200, {**TENANT, "name": "gb200"})
    narrower = {
        **TENANT,
        "nodeSelector": {"matchLabels": {POOL: "gb200", "example.com/tenant": "a"}},
    }
    text = _problems(GB200, narrower)
    assert "overrides[1] (tenant-a): never applies: overrides[0] (gb200) matches every node" in text
    _load(narrower, GB200)  # the narrower first: both apply to someone


def test_a_policy_of_the_previous_version_has_no_groups() -> None:
    policy = load_policy(DEFAULT_POLICY_YAML)
    assert policy.overrides == ()
    found = policy_for(policy, {POOL: "gb200"})
    assert found.policy is policy and found.policy.group_budget is None


def test_selector_requirements() -> None:
    sel = LabelSelector.model_validate(
        {
            "matchLabels": {"sku": "gb200"},
            "matchExpressions": [
                {"key": "rack", "operator": "NotIn", "values": ["r9"]},
                {"key": "gpufleet.io/spare", "operator": "DoesNotExist"},
                {"key": "tenant", "operator": "Exists"},
            ],
        }
    )
    assert sel.matches({"sku": "gb200", "rack": "r1", "tenant": "a"})
    assert sel.matches({"sku": "gb200", "tenant": "a"})  # NotIn holds for an absent key
    assert not sel.matches({"sku": "gb200", "rack": "r9", "tenant": "a"})
    assert not sel.matches({"sku": "gb200", "tenant": "a", "gpufleet.io/spare": "true"})
    assert not sel.matches({"sku": "gb200"})


def _pool(name: str) -> str:
    """g0, g1 in pool p1; g2, g3 in p2; every h in p3 (a group spans pools)."""
    return {"g0": "p1", "g1": "p1", "g2": "p2", "g3": "p2"}.get(name, "p3")


def _fleet(policy: Policy, labels: dict[str, dict[str, str]], out: set[str]) -> FleetView:
    records = [
        NodeRecord.new(
            name,
            at=0.0,
            pool=_pool(name),
            state=NodeState.REMEDIATING if name in out else NodeState.PRODUCTION,
        )
        for name in labels
    ]
    return FleetView.of([_grouped(r, policy, labels[r.name]) for r in records])


def _grouped(record: NodeRecord, policy: Policy, labels: dict[str, str]) -> NodeRecord:
    from dataclasses import replace

    return replace(record, group=group_of(policy, labels))


def test_a_group_budget_holds_on_top_of_the_pools() -> None:
    """A burst on the group: its budget (1) holds though the pool's (50) has room; a node
    of no group is held to the pool's budget alone."""
    policy = _load(GB200)
    labels = {f"g{i}": {POOL: "gb200"} for i in range(4)} | {
        f"h{i}": {POOL: "h100"} for i in range(20)
    }
    fleet = _fleet(policy, labels, out={"g0"})
    assert fleet.group("gb200").size == 4 and fleet.group("gb200").out_of_service == 1
    assert fleet.pool("p2").out_of_service == 0  # g2's pool has room
    g2 = NodeRecord.new("g2", at=0.0, pool="p2", state=NodeState.PRODUCTION)
    g2 = _grouped(g2, policy, labels["g2"])
    resolved = policy_for(policy, labels["g2"]).policy
    d = decide(g2, fleet, ev.FaultObserved(_xid(48, "g2")), resolved, 2.0)
    assert d.hold is Hold.BUDGET_EXHAUSTED
    # Without the group's budget the same fault would take g2 out.
    d = decide(g2, fleet, ev.FaultObserved(_xid(48, "g2")), policy, 2.0)
    assert d.hold is None and d.record.state is NodeState.DRAINING
    h1 = NodeRecord.new("h1", at=0.0, pool="p3", state=NodeState.PRODUCTION)
    d = decide(h1, fleet, ev.FaultObserved(_xid(48, "h1")), policy, 2.0)
    assert d.hold is None and d.record.state is NodeState.DRAINING


def test_a_group_counts_every_pool() -> None:
    """The group's nodes are counted across pools; a change of group moves the counts."""
    policy = _load(GB200)
    a = NodeRecord.new("a", at=0.0, pool="p1", state=NodeState.REMEDIATING)
    b = NodeRecord.new("b", at=0.0, pool="p2", state=NodeState.PRODUCTION)
    a, b = (_grouped(r, policy, {POOL: "gb200"}) for r in (a, b))
    view = FleetView.of([a, b])
    assert view.group("gb200").size == 2 and view.group("gb200").out_of_service == 1
    from dataclasses import replace

    moved = view.with_change(a, replace(a, group=""))
    assert moved.group("gb200").size == 1 and moved.group("gb200").out_of_service == 0
    assert moved == FleetView.of([replace(a, group=""), b])


def test_explain_node_names_the_override_and_the_rule() -> None:
    policy = _load(GB200)
    found = explain_node(policy, {POOL: "gb200"}, xid=79)
    assert found.override == "gb200"
    assert found.fault is not None and found.fault.first == "reimage"
    assert found.fault.source == "override gb200"
    assert any(line.startswith("group gb200 budget: at most 1 nodes") for line in found.budgets)
    other = explain_node(policy, {POOL: "h100"}, xid=79)
    assert other.override is None and other.fault is not None
    assert other.fault.first != "reimage"


def test_a_group_budget_that_holds_nothing_more_is_a_warning() -> None:
    loose = _load({**GB200, "budget": {"maxNodes": 500}})
    assert loose.warnings() == [
        "overrides[0] (gb200).budget: no tighter than safety.budget in any field; a node is "
        "held to both, so it changes nothing"
    ]
    assert _load(GB200).warnings() == []


def test_a_record_of_no_group_is_stored_as_before_groups() -> None:
    """An upgrade must not rewrite every Node's record: without a group, no ``group`` key."""
    from dataclasses import replace

    from gpufleet.domain.records import record_from_json, record_to_json

    plain = NodeRecord.new("n1", at=0.0, pool="p")
    assert '"group"' not in record_to_json(plain)
    assert record_from_json(record_to_json(plain)) == plain
    grouped = replace(plain, group="gb200")
    assert record_from_json(record_to_json(grouped)) == grouped
