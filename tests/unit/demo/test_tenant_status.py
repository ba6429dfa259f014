"""One tenant's screen from what was read: its nodes, GPUs and the incidents it was told of."""

from __future__ import annotations

from typing import Any

from gpufleet.demo import tenant_status as ts
from gpufleet.domain import tenant_events

TENANT: dict[str, Any] = {
    "apiVersion": "gpufleet.io/v1alpha1",
    "kind": "Tenant",
    "metadata": {"name": "vision"},
    "spec": {
        "displayName": "Vision team",
        "namespaces": ["vision", "vision-serve"],
        "gpuQuota": 16,
        "nodes": {"selector": {"pool": "vision"}},
    },
    "status": {
        "usage": {"kubernetesGpus": 4, "slurmGpus": 8},
        "limits": {"kubernetesGpus": 8, "slurmGpus": 12},
        "conditions": [{"type": "Ready", "status": "True", "message": ""}],
    },
}


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"unschedulable": True}}


def _pod(ns: str, name: str, node: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    res = {"requests": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    return {
        "metadata": {"namespace": ns, "name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": res}]},
        "status": {"phase": phase},
    }


def _event(ns: str, incident: str, tenant: str = "vision") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": ns,
            "labels": {"gpufleet.io/tenant": tenant, tenant_events.LABEL_INCIDENT: incident},
        },
        "reason": tenant_events.REASON,
        "involvedObject": {"kind": "Node", "name": "n1"},
        "firstTimestamp": "2026-02-01T00:00:00Z",
        "message": "node n1 is out for repair (xid-79)",
    }


def test_nodes_gpus_incidents_and_their_goodput() -> None:
    nrem = {
        "metadata": {"name": "n1-xid"},
        "status": {
            "phase": "Succeeded",
            "outcome": "repaired",
            "goodput": {"lostGpuSeconds": {"detection": 3600, "redone": 7200}, "trainings": ["t"]},
        },
    }
    st = ts.summarize(
        TENANT,
        [
            _node("n1", **{"gpufleet.io/state": "remediating"}),
            _node("n2", pool="vision"),
            _node("n3"),
        ],
        [
            _pod("vision", "a", "n1", 4),
            _pod("vision-serve", "b", "n1", 0),
            _pod("vision", "done", "n3", 8, phase="Succeeded"),
            _pod("other", "c", "n3", 8),
        ],
        [
            _event("vision", "n1-xid"),
            _event("vision-serve", "n1-xid"),
            _event("vision", "x", "speech"),
        ],
        [nrem],
    )
    assert [(r.node, r.state, r.gpus, r.pods, r.owned) for r in st.nodes] == [
        ("n1", "remediating (cordoned)", 4, 2, False),
        ("n2", "- (cordoned)", 0, 0, True),
    ]
    (inc,) = st.incidents  # the same incident told in two namespaces is one row
    assert (inc.incident, inc.node, inc.phase) == ("n1-xid", "n1", "Succeeded: repaired")
    assert inc.lost_gpu_seconds == {"detection": 3600.0, "redone": 7200.0}
    data = ts.to_data(st)
    assert data["gpuQuota"] == 16 and data["usage"] == {"kubernetesGpus": 4, "slurmGpus": 8}
    assert data["problems"] == []
    # Rendered without error, and the quota line says what is held of what.
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(ts.render(st))
    text = console.export_text()
    assert "12 of 16 (4 in pods, 8 in Slurm jobs)" in text
    assert "8 GPUs in pods, 12 in Slurm jobs" in text and "3.00" in text


def test_unreadable_nodes_and_remediations_still_show_the_pods_nodes() -> None:
    st = ts.summarize(TENANT, [], [_pod("vision", "a", "n9", 2)], [_event("vision", "gone")], None)
    assert [(r.node, r.state, r.gpus) for r in st.nodes] == [("n9", "-", 2)]
    assert st.incidents[0].phase == "-"
    st = ts.summarize(TENANT, [], [], [_event("vision", "gone")], [])
    assert st.incidents[0].phase == "gone"


def test_a_refused_spec_is_shown_with_why() -> None:
    bad = {**TENANT, "spec": {**TENANT["spec"], "gpuQuota": -2}}
    st = ts.summarize(bad, [], [], [], [])
    assert any("gpuQuota" in p for p in st.problems)


def test_owned_nodes_are_those_the_controller_applied_once_it_wrote_them() -> None:
    applied = {**TENANT, "status": {**TENANT["status"], "nodes": ["n3"]}}
    st = ts.summarize(applied, [_node("n2", pool="vision"), _node("n3")], [], [], [])
    assert [(r.node, r.owned) for r in st.nodes] == [("n3", True)]
