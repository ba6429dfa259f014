"""The NVLink domain as a failure domain: ``safety.budget.perDomain`` holds a second tray of
one domain while the pool has room, lets a node of another domain (or of none) go, is
counted as records change and named in the hold, explain and the records (decision 0232)."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest
import yaml

from gpufleet.domain import events as ev
from gpufleet.domain.decide import decide
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.explain import explain_node
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.policy import DomainFaults, Policy, PolicyError, load_policy
from gpufleet.domain.policy_groups import domain_of
from gpufleet.domain.records import FleetView, NodeRecord, record_from_json, record_to_json
from gpufleet.domain.safety import Hold
from gpufleet.domain.states import OUT_OF_SERVICE, NodeState
from gpufleet.domain.topology import nvlink_domain_of
from gpufleet.domain.well_known import LABEL_NVLINK_CLIQUE, LABEL_NVLINK_CLUSTER

DOMAIN = "network.topology.nvidia.com/accelerator"


def _load(per_domain: dict[str, Any] | None = None, **budget: Any) -> Policy:
    spec: dict[str, Any] = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec["safety"]["budget"].update({"maxNodes": 50, "maxPercent": 100, **budget})
    if per_domain is not None:
        spec["safety"]["budget"]["perDomain"] = per_domain
    return load_policy(json.dumps(spec))


def _xid(node: str) -> ev.FaultObserved:
    return ev.FaultObserved(
        FaultEvent(FaultKind.XID, node, at=1.0, xid=48, evidence=Evidence(gpu_index=0))
    )


def _node(name: str, domain: str, state: NodeState = NodeState.PRODUCTION) -> NodeRecord:
    return replace(NodeRecord.new(name, at=0.0, pool="gb200", state=state), nvlink_domain=domain)


def _fleet(out: set[str]) -> tuple[FleetView, dict[str, NodeRecord]]:
    """Two NVL72 domains of 18 trays each in one pool (50 may go), and 4 nodes of none."""
    records = {
        f"{d}-{i}": _node(
            f"{d}-{i}", d, NodeState.DRAINING if f"{d}-{i}" in out else NodeState.PRODUCTION
        )
        for d in ("nvl-a", "nvl-b")
        for i in range(18)
    } | {f"x{i}": _node(f"x{i}", "") for i in range(4)}
    return FleetView.of(records.values()), records


def test_a_second_tray_of_a_domain_is_held_while_the_pool_has_room() -> None:
    policy = _load({"maxNodes": 1})
    fleet, records = _fleet(out={"nvl-a-0"})
    assert fleet.domain("nvl-a").out_of_service == 1 and fleet.domain("nvl-a").size == 18
    d = decide(records["nvl-a-1"], fleet, _xid("nvl-a-1"), policy, 2.0)
    assert d.hold is Hold.BUDGET_EXHAUSTED and d.record.pending is not None
    assert d.reasons[-1] == (
        "held: the disruption budget of NVLink domain nvl-a is used up (1 of at most 1 out)"
    )
    # A tray of the other domain, and a node of no domain, go.
    for name in ("nvl-b-0", "x0"):
        d = decide(records[name], fleet, _xid(name), policy, 2.0)
        assert d.hold is None and d.record.state is NodeState.DRAINING
    # Without the per-domain budget the same fault takes the second tray out.
    d = decide(records["nvl-a-1"], fleet, _xid("nvl-a-1"), _load(), 2.0)
    assert d.hold is None and d.record.state is NodeState.DRAINING


def test_the_domain_budget_is_on_top_of_the_pools() -> None:
    """A domain with room does not lift the pool's budget: every budget must allow it."""
    policy = _load({"maxNodes": 3}, maxNodes=1)
    fleet, records = _fleet(out={"nvl-a-0"})
    d = decide(records["nvl-a-1"], fleet, _xid("nvl-a-1"), policy, 2.0)
    assert d.hold is Hold.BUDGET_EXHAUSTED
    assert "NVLink domain" not in d.reasons[-1]  # the pool's budget held it


def test_zero_stops_every_node_of_a_domain_and_none_other() -> None:
    policy = _load({"maxNodes": 0})
    fleet, records = _fleet(out=set())
    assert decide(records["nvl-b-3"], fleet, _xid("nvl-b-3"), policy, 2.0).hold is (
        Hold.BUDGET_EXHAUSTED
    )
    assert decide(records["x1"], fleet, _xid("x1"), policy, 2.0).hold is None


def test_the_domain_counts_follow_every_change() -> None:
    """FleetView.with_change keeps the per-domain counts a rebuild would give, whatever
    the sequence (a node moving domain, entering and leaving service)."""
    rng = random.Random(5)
    records = {f"n{i}": _node(f"n{i}", "") for i in range(12)}
    view = FleetView.of(records.values())
    states = list(NodeState)
    for _ in range(1500):
        name = rng.choice(list(records))
        before = records[name]
        after = replace(
            before, state=rng.choice(states), nvlink_domain=rng.choice(["", "d1", "d2", "d3"])
        )
        records[name] = after
        view = view.with_change(before, after)
        assert dict(view.domains) == dict(FleetView.of(records.values()).domains)
    out = sum(r.state in OUT_OF_SERVICE for r in records.values() if r.nvlink_domain == "d1")
    assert view.domain("d1").out_of_service == out


def test_the_domain_is_read_by_the_topology_codec() -> None:
    """The label names the domain; the node's own clique wins over it when they agree on
    the cluster; a contradiction, or a value that is no name, is no domain."""
    assert nvlink_domain_of("n", {DOMAIN: "nvl-7"}, DOMAIN) == "nvl-7"
    assert nvlink_domain_of("n", {"example.com/rack-domain": "r1"}, "example.com/rack-domain") == (
        "r1"
    )
    seen = {LABEL_NVLINK_CLUSTER: "c1", LABEL_NVLINK_CLIQUE: "c1.3"}
    assert nvlink_domain_of("n", {**seen, DOMAIN: "c1"}, DOMAIN) == "c1.3"
    assert nvlink_domain_of("n", {**seen, DOMAIN: "other"}, DOMAIN) == ""
    assert nvlink_domain_of("n", {DOMAIN: "-bad-"}, DOMAIN) == ""
    assert nvlink_domain_of("n", {}, DOMAIN) == ""
    # Counted when the policy sets a per-domain budget or judges fabric faults by domain
    # (domainFaults, on by default: decision 0240); with neither, no domain.
    assert domain_of(_load(), "n", {DOMAIN: "nvl-7"}) == "nvl-7"
    off = _load().model_copy(update={"domain_faults": DomainFaults(min_trays=0)})
    assert domain_of(off, "n", {DOMAIN: "nvl-7"}) == ""
    assert domain_of(_load({"maxNodes": 2}), "n", {DOMAIN: "nvl-7"}) == "nvl-7"


@pytest.mark.parametrize(
    ("per_domain", "expected"),
    [
        ({"maxNodes": -1}, "greater than or equal to 0"),
        ({"maxNodes": 1, "fleetMaxNodes": 3}, "Extra inputs are not permitted"),
        ({"label": "not a label"}, "String should match pattern"),
    ],
)
def test_a_bad_domain_budget_is_refused(per_domain: dict[str, Any], expected: str) -> None:
    with pytest.raises(PolicyError, match=expected):
        _load(per_domain)


def test_a_group_may_set_only_its_k_and_only_beside_the_fleets_domain_budget() -> None:
    """The domain's label and counting are fleet-wide (decision 0243): a group's perDomain
    names maxNodes alone, and needs safety.budget.perDomain."""
    spec: dict[str, Any] = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec["overrides"] = [
        {
            "name": "rack-a",
            "nodeSelector": {"matchLabels": {"example.com/rack": "a"}},
            "budget": {"perDomain": {"maxNodes": 1}},
        }
    ]
    with pytest.raises(PolicyError, match=r"needs safety\.budget\.perDomain"):
        load_policy(json.dumps(spec))
    spec["overrides"][0]["budget"]["perDomain"]["label"] = DOMAIN
    with pytest.raises(PolicyError, match="label"):
        load_policy(json.dumps(spec))


def test_explain_lists_the_domain_budget() -> None:
    policy = _load({"maxNodes": 2})
    lines = explain_node(policy, {DOMAIN: "nvl-a"}, node="nvl-a-1").budgets
    assert lines[-1] == (
        "NVLink domain nvl-a budget: at most 2 nodes of one NVLink domain out at once, "
        "on top of the above"
    )
    lines = explain_node(policy, {}, node="x0").budgets
    assert lines[-1].endswith("this node is in no NVLink domain: not held by it")
    assert not any("domain" in line for line in explain_node(_load(), {DOMAIN: "a"}).budgets)


def test_a_record_of_no_domain_is_stored_as_before() -> None:
    """An upgrade must not rewrite every Node's record: without a domain, no key."""
    plain = NodeRecord.new("n1", at=0.0, pool="p")
    assert "nvlink_domain" not in record_to_json(plain)
    placed = replace(plain, nvlink_domain="nvl-a")
    assert record_from_json(record_to_json(placed)) == placed
