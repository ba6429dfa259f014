"""``gpufleet cleanup`` (the chart's pre-delete hook) against a real apiserver: it stops a
writer and waits for its pods, takes gpufleet off a Node in production, keeps a Node held
for a fault exactly as it was (with a Warning Event), and leaves another's cordon alone."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from controller_harness import Api
from test_cli_output import gpufleet
from waiting import wait_for

from gpufleet.domain import well_known as wk
from gpufleet.domain.records import NodeRecord, record_to_json
from gpufleet.domain.states import NodeState

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SELECTOR = "test.gpufleet.io/cleanup"


def make_node(api: Api, name: str, run: str, *, state: str, taints: list[Any], **spec: Any) -> None:
    record = record_to_json(NodeRecord.new(name, at=1.0, state=NodeState(state), reason="xid-79"))
    api.post(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {SELECTOR: run, wk.LABEL_STATE: state, wk.LABEL_POOL: "train"},
                "annotations": {wk.ANNOTATION_RECORD: record, wk.ANNOTATION_REASON: "xid-79"},
            },
            "spec": {"taints": taints, **spec},
        },
    )
    api.patch(
        f"/api/v1/nodes/{name}/status",
        {"status": {"conditions": [{"type": "GpuProblem", "status": "False", "reason": "Ok"}]}},
        kind="strategic-merge",
    )


def own_taints(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The Node's taints but Kubernetes' own (its node lifecycle controller adds and removes
    ``node.kubernetes.io/*`` on these kubelet-less Nodes whenever it likes)."""
    return [
        t
        for t in node["spec"].get("taints") or []
        if not t["key"].startswith("node.kubernetes.io/")
    ]


@pytest.fixture
def nodes(local_cluster: Any) -> Iterator[tuple[Api, str, str, str, str]]:
    api = Api(local_cluster)
    run = uuid.uuid4().hex[:8]
    prod, held, theirs = f"cleanup-prod-{run}", f"cleanup-held-{run}", f"cleanup-theirs-{run}"
    slurm = {"key": wk.TAINT_SLURM, "value": "held", "effect": "NoSchedule"}
    other = {"key": "example.com/reserved", "value": "x", "effect": "NoSchedule"}
    make_node(api, prod, run, state="production", taints=[slurm, other], unschedulable=True)
    api.patch(
        f"/api/v1/nodes/{prod}",
        {"metadata": {"annotations": {wk.ANNOTATION_CORDONED: wk.CONTROLLER}}},
    )
    unhealthy = {"key": wk.TAINT_UNHEALTHY, "value": "xid-79", "effect": "NoExecute"}
    make_node(api, held, run, state="remediating", taints=[unhealthy], unschedulable=True)
    make_node(api, theirs, run, state="production", taints=[], unschedulable=True)
    try:
        yield api, run, prod, held, theirs
    finally:
        for name in (prod, held, theirs):
            api.delete(f"/api/v1/nodes/{name}")


def test_cleanup_releases_a_production_node_and_keeps_a_held_one(
    local_cluster: Any, nodes: tuple[Api, str, str, str, str]
) -> None:
    api, run, prod, held, theirs = nodes
    held_before = api.get(f"/api/v1/nodes/{held}")
    kube = ["--kubeconfig", str(local_cluster.kubeconfig), "-l", f"{SELECTOR}={run}"]

    dry = gpufleet("cleanup", *kube, "--dry-run", "-o", "json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dryRun"] and set(report["released"]) == {prod, theirs}
    assert api.get(f"/api/v1/nodes/{prod}")["metadata"]["labels"][wk.LABEL_STATE] == "production"

    done = gpufleet("cleanup", *kube, "-o", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["kept"] == {held: "state remediating: xid-79"}

    node = api.get(f"/api/v1/nodes/{prod}")
    assert node["metadata"]["labels"] == {SELECTOR: run, wk.LABEL_POOL: "train"} | {
        k: v for k, v in node["metadata"]["labels"].items() if k.startswith("kubernetes.io/")
    }
    assert not {wk.ANNOTATION_RECORD, wk.ANNOTATION_REASON, wk.ANNOTATION_CORDONED} & set(
        node["metadata"].get("annotations") or {}
    )
    assert own_taints(node) == [
        {"key": "example.com/reserved", "value": "x", "effect": "NoSchedule"}
    ]
    assert not node["spec"].get("unschedulable")
    assert "GpuProblem" not in {c["type"] for c in node["status"].get("conditions") or []}

    # Not cordoned by gpufleet: the cordon stays, the rest of ours goes.
    other = api.get(f"/api/v1/nodes/{theirs}")
    assert other["spec"].get("unschedulable") is True
    assert wk.LABEL_STATE not in other["metadata"]["labels"]

    # Held for a fault: not one byte changed, and a Warning Event says why.
    after = api.get(f"/api/v1/nodes/{held}")
    for part in ("labels", "annotations"):
        assert after["metadata"].get(part) == held_before["metadata"].get(part)
    assert own_taints(after) == own_taints(held_before)
    assert after["spec"].get("unschedulable") is True
    events = api.get(
        f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{held}"
    )["items"]
    # (Kubernetes' node controller posts its own Events about these Nodes too.)
    (kept,) = [e for e in events if e["reason"] == "KeptOnUninstall"]
    assert kept["type"] == "Warning" and "state remediating" in kept["message"]
    assert kept["source"]["component"] == "gpufleet-cleanup"


def test_cleanup_stops_its_writers_first(local_cluster: Any) -> None:
    api = Api(local_cluster)
    ns = f"cleanup-{uuid.uuid4().hex[:8]}"
    api.post(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
    )
    try:
        labels = {"app": "writer"}
        api.post(
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "writer"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "tolerations": [{"operator": "Exists"}],
                            "containers": [{"name": "w", "image": "writer:1"}],
                        },
                    },
                },
            },
        )
        wait_for(
            "the writer's pod",
            lambda: api.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dwriter")["items"],
            120,
        )
        r = gpufleet(
            "cleanup", "--kubeconfig", str(local_cluster.kubeconfig), "-n", ns,
            "--stop", "deployment/writer", "--stop", "daemonset/absent", "-l", "no-such=label",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "deployment " + ns + "/writer: stopped" in r.stdout
        assert "daemonset " + ns + "/absent: not found, skipped" in r.stdout
        dep = api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/writer")
        assert dep["spec"]["replicas"] == 0
        assert not api.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dwriter")["items"]
    finally:
        api.delete(f"/api/v1/namespaces/{ns}")
