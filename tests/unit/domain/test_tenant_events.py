"""Which tenants hear of a node taken out for repair, and what their Events say."""

from __future__ import annotations

from gpufleet.domain import tenant_events as te
from gpufleet.domain.tenancy import Tenant

VISION = Tenant(
    name="vision",
    created="2026-01-01T00:00:00Z",
    namespaces=("vision", "vision-serve"),
    node_selector={"gpufleet.io/pool": "vision"},
)
SPEECH = Tenant(name="speech", created="2026-01-02T00:00:00Z", namespaces=("speech",))


def _nrem(name: str, node: str, **status: object) -> dict[str, object]:
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-02-01T00:00:00Z"},
        "spec": {"node": node, "fault": "xid-79", "description": "GPU 3 fell off the bus"},
        "status": status,
    }


def test_incident_of_reads_open_ones_only() -> None:
    inc = te.incident_of(_nrem("n1-xid", "n1", phase="Remediating"))
    assert inc == te.Incident(
        name="n1-xid",
        node="n1",
        fault="xid-79",
        description="GPU 3 fell off the bus",
        phase="Remediating",
        started_at="2026-02-01T00:00:00Z",
    )
    assert te.incident_of(_nrem("a", "n1", phase="Succeeded")) is None
    assert te.incident_of(_nrem("a", "n1", phase="Escalated", completedAt="x")) is None
    assert te.incident_of({"metadata": {"name": "a"}, "spec": {}}) is None
    # Escalated and open: the node stays out (triage, RMA): told.
    assert te.incident_of(_nrem("a", "n1", phase="Escalated")) is not None


def test_a_tenant_with_pods_on_the_node_hears_in_each_namespace() -> None:
    inc = te.incident_of(_nrem("n1-xid", "n1", phase="Draining"))
    assert inc is not None
    out = te.node_events(
        [VISION, SPEECH],
        [inc],
        {"n1": {}},
        {"n1": [("vision", "train-1"), ("vision", "train-0"), ("other", "x")]},
    )
    assert [(e.tenant, e.namespace, e.name) for e in out] == [
        ("vision", "vision", "n1-xid.vision"),
        ("vision", "vision-serve", "n1-xid.vision"),
    ]
    msg = out[0].message
    assert "node n1 is out for repair (xid-79: GPU 3 fell off the bus" in msg
    assert "NodeRemediation n1-xid, Draining" in msg
    assert "vision/train-0, vision/train-1" in msg  # sorted; another namespace's pod not named
    assert "other/x" not in msg and "own nodes" not in msg


def test_an_owned_node_is_told_without_pods_and_others_hear_nothing() -> None:
    inc = te.incident_of(_nrem("n2-ib", "n2"))
    assert inc is not None
    labels = {"n2": {"gpufleet.io/pool": "vision", "zone": "a"}}
    out = te.node_events([VISION, SPEECH], [inc], labels, {})
    assert {e.tenant for e in out} == {"vision"}
    assert "one of tenant vision's own nodes" in out[0].message
    # A tenant without a selector owns nothing; a partial match is not ownership.
    assert not te.owns(SPEECH, labels["n2"])
    assert not te.owns(VISION, {"gpufleet.io/pool": "speech"})
    assert te.node_events([SPEECH], [inc], labels, {"n2": [("vision", "p")]}) == []


def test_many_pods_are_cut_and_names_stay_valid() -> None:
    inc = te.Incident("x" * 250, "n1", "xid-48", "", "Draining", "")
    pods = [("speech", f"p{i:02d}") for i in range(12)]
    (ev,) = te.node_events([SPEECH], [inc], {}, {"n1": pods})
    assert ev.message.endswith("p09 and 2 more")
    assert "(xid-48; NodeRemediation" in ev.message
    assert len(ev.name) <= 253
