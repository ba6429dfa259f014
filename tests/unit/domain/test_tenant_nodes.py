"""domain.tenant_nodes: which tenant owns which node, and the Node writes that mark it."""

from __future__ import annotations

from typing import Any

from gpufleet.domain import tenant_nodes as tn
from gpufleet.domain.maintenance import Reservation
from gpufleet.domain.tenancy import Tenant

POOL = "gpufleet.io/pool"


def tenant(name: str, pool: str, created: str = "2026-01-01T00:00:00Z") -> Tenant:
    return Tenant(name=name, created=created, node_selector={POOL: pool})


def node(
    name: str,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": "7",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"taints": taints or []},
    }


def labels_of(nodes: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {n: o["metadata"]["labels"] for n, o in nodes.items()}


def test_the_older_tenant_keeps_a_node_both_select_and_the_newer_owns_none() -> None:
    nodes = {"a": {POOL: "x"}, "b": {POOL: "x"}, "c": {POOL: "y"}, "d": {}}
    old = tenant("vision", "x", "2026-01-01T00:00:00Z")
    new = Tenant(name="nlp", created="2026-02-01T00:00:00Z", node_selector={POOL: "x"})
    other = tenant("speech", "y")
    got = tn.ownership([new, other, old], nodes)
    assert got.nodes_of("vision") == ["a", "b"]
    assert got.nodes_of("speech") == ["c"]
    assert got.nodes_of("nlp") == []
    assert got.conflicts["nlp"] == [
        "node a belongs to tenant vision",
        "node b belongs to tenant vision",
    ]
    assert got.conflicts["vision"] == []


def test_an_empty_selector_selects_nothing() -> None:
    t = Tenant(name="vision", created="2026-01-01T00:00:00Z")
    assert tn.ownership([t], {"a": {POOL: "x"}}).owner == {}


def test_an_owned_node_gets_the_label_the_taint_and_the_record_keeping_other_taints() -> None:
    slurm = {"key": "gpufleet.io/slurm", "value": "held", "effect": "NoSchedule"}
    nodes = {"a": node("a", {POOL: "x"}, [slurm])}
    plan = tn.plan_nodes(tn.ownership([tenant("vision", "x")], labels_of(nodes)), nodes)
    (w,) = plan.writes
    assert (w.node, w.tenant) == ("a", "vision")
    assert w.patch["metadata"] == {
        "labels": {"gpufleet.io/tenant": "vision"},
        "annotations": {"gpufleet.io/tenant-set": "vision"},
        "resourceVersion": "7",
    }
    assert w.patch["spec"]["taints"] == [
        slurm,
        {"key": "gpufleet.io/tenant", "value": "vision", "effect": "NoSchedule"},
    ]
    assert plan.foreign == {}


def marked(name: str, tenant_: str, labels: dict[str, str]) -> dict[str, Any]:
    return node(
        name,
        {**labels, "gpufleet.io/tenant": tenant_},
        [{"key": "gpufleet.io/tenant", "value": tenant_, "effect": "NoSchedule"}],
        {"gpufleet.io/tenant-set": tenant_},
    )


def test_a_marked_node_still_owned_needs_no_write() -> None:
    nodes = {"a": marked("a", "vision", {POOL: "x"})}
    own = tn.ownership([tenant("vision", "x")], labels_of(nodes))
    assert tn.plan_nodes(own, nodes).writes == ()


def test_a_released_node_loses_what_gpufleet_set_only() -> None:
    drain = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    n = marked("a", "vision", {POOL: "other"})
    n["spec"]["taints"].insert(0, drain)
    nodes = {"a": n}
    plan = tn.plan_nodes(tn.ownership([tenant("vision", "x")], labels_of(nodes)), nodes)
    (w,) = plan.writes
    assert w.tenant is None
    assert w.patch["metadata"]["labels"] == {"gpufleet.io/tenant": None}
    assert w.patch["metadata"]["annotations"] == {"gpufleet.io/tenant-set": None}
    assert w.patch["spec"]["taints"] == [drain]


def test_a_label_of_the_key_gpufleet_did_not_set_is_never_touched() -> None:
    hand = node("a", {POOL: "x", "gpufleet.io/tenant": "someone"})
    hand_taint = node(
        "b", {POOL: "x"}, [{"key": "gpufleet.io/tenant", "value": "x", "effect": "NoExecute"}]
    )
    alone = node("c", {"gpufleet.io/tenant": "someone"})
    nodes = {"a": hand, "b": hand_taint, "c": alone}
    plan = tn.plan_nodes(tn.ownership([tenant("vision", "x")], labels_of(nodes)), nodes)
    assert plan.writes == ()
    assert sorted(plan.foreign) == ["a", "b"]
    assert "did not set: left alone" in plan.foreign["a"]


def test_a_node_moves_only_from_a_tenant_that_let_go() -> None:
    nodes = {"a": marked("a", "vision", {POOL: "x"})}
    nlp = tenant("nlp", "x", "2026-02-01T00:00:00Z")
    # vision deleted (not among the tenants to apply): the node goes to nlp.
    (w,) = tn.plan_nodes(tn.ownership([nlp], labels_of(nodes)), nodes).writes
    assert w.tenant == "nlp"
    assert w.patch["metadata"]["labels"] == {"gpufleet.io/tenant": "nlp"}
    # vision still there: nlp is in conflict and nothing is written.
    own = tn.ownership([nlp, tenant("vision", "x")], labels_of(nodes))
    assert tn.plan_nodes(own, nodes).writes == ()


def test_a_reservation_per_tenant_on_its_slurm_nodes_for_its_account() -> None:
    nodes = {"a": {POOL: "x"}, "b": {POOL: "x"}, "c": {POOL: "y"}, "d": {POOL: "z"}}
    own = tn.ownership([tenant("vision", "x"), tenant("speech", "y"), tenant("nlp", "z")], nodes)
    aliases = {
        "a": frozenset({"a"}),
        "b": frozenset({"b", "10.0.0.2", "host-b"}),
        "c": frozenset({"c"}),
        "d": frozenset({"d"}),
    }
    names = tn.slurm_names(aliases, frozenset({"a", "host-b", "d"}))
    assert names == {"a": "a", "b": "host-b", "d": "d"}  # c: not a Slurm node
    wanted = tn.wanted_reservations(own, {"vision": "vis", "speech": "sp"}, names)
    assert wanted == [
        Reservation("gpufleet-tenant-vision", 0.0, frozenset({"a", "host-b"}), frozenset({"vis"}))
    ]  # speech: no Slurm node; nlp: no account given


def test_reservations_are_created_updated_and_deleted_only_when_gpufleets() -> None:
    want = Reservation("gpufleet-tenant-vision", 0.0, frozenset({"a", "b"}), frozenset({"vis"}))
    same = Reservation("gpufleet-tenant-vision", 12.0, frozenset({"a", "b"}), frozenset({"vis"}))
    grown = Reservation("gpufleet-tenant-vision", 12.0, frozenset({"a"}), frozenset({"vis"}))
    gone = Reservation("gpufleet-tenant-old", 12.0, frozenset({"c"}), frozenset({"old"}))
    maint = Reservation("gpufleet-maint-plan", 12.0, frozenset({"c"}))
    hand = Reservation("physics", 12.0, frozenset({"a"}), frozenset({"phys"}))
    assert tn.plan_reservations([want], [maint, hand]) == [tn.ReservationWrite("create", want)]
    assert tn.plan_reservations([want], [same, hand]) == []
    assert tn.plan_reservations([want], [grown, gone, maint]) == [
        tn.ReservationWrite("update", want),
        tn.ReservationWrite("delete", gone),
    ]
