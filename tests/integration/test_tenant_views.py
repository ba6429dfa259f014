"""What a tenant sees of the fleet, on the real apiserver: the tenant controller's node
Events in the tenant's namespaces (one per incident and namespace, written once, a restarted
writer writes none again; a tenant with no work on the node hears nothing) and
`gpufleet status --tenant` reading its nodes, GPUs and incidents back (docs/tenants.md).

No controller runs here: the NodeRemediations are written as the lifecycle controller writes
them, the Events by gpufleet.tenants.node_events as the tenant controller calls it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.api import tenant as tenant_api
from gpufleet.domain import tenant_events
from gpufleet.kubeapi import EVENTS, KubeApi, custom
from gpufleet.local.cluster import ClusterInfo
from gpufleet.tenants.node_events import NodeEventCopier

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
VISION, SPEECH = "tv-vision", "tv-speech"
NAMESPACES = (VISION, f"{VISION}-serve", SPEECH)


def _kubectl(info: ClusterInfo, *args: str, stdin: str | None = None) -> str:
    r = subprocess.run(
        [str(info.kubectl), *args],
        input=stdin,
        env=info.kube_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _tenant(name: str, namespaces: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "Tenant",
        "metadata": {"name": name},
        "spec": {"namespaces": namespaces, **spec},
    }


def _pod(ns: str, name: str, node: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "train",
                    "image": "trainer:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def _nrem(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "NodeRemediation",
        "metadata": {"name": name},
        "spec": {"node": node, "fault": "xid-79", "description": "GPU 3 fell off the bus"},
    }


@pytest.fixture(scope="module")
def objects(local_cluster: ClusterInfo) -> Iterator[ClusterInfo]:
    info = local_cluster
    crds = [ROOT / "deploy" / "crds" / f"{p}.yaml" for p in ("noderemediations", "tenants")]
    _kubectl(info, "apply", "--server-side", "--force-conflicts", *(f"-f={c}" for c in crds))
    _kubectl(info, "wait", "--for=condition=Established", "--timeout=60s",
             "crd/noderemediations.gpufleet.io", "crd/tenants.gpufleet.io")  # fmt: skip
    work, owned, elsewhere = info.node_names[1], info.node_names[2], info.node_names[3]
    docs: list[dict[str, Any]] = [
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in NAMESPACES),
        _tenant(
            VISION,
            [VISION, f"{VISION}-serve"],
            gpuQuota=16,
            nodes={"selector": {"kubernetes.io/hostname": owned}},
        ),
        _tenant(SPEECH, [SPEECH]),
        _pod(VISION, "train-0", work, 2),
        _pod(SPEECH, "serve-0", elsewhere, 1),
        _nrem("tv-work-xid", work),
        _nrem("tv-owned-xid", owned),
    ]
    _kubectl(info, "apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    try:
        yield info
    finally:
        _kubectl(info, "delete", "--wait=false", "--ignore-not-found",
                 "noderemediation/tv-work-xid", "noderemediation/tv-owned-xid",
                 f"tenant/{VISION}", f"tenant/{SPEECH}",
                 *(f"namespace/{n}" for n in NAMESPACES))  # fmt: skip


def _copy(info: ClusterInfo, copier: NodeEventCopier | None = None) -> tuple[int, int]:
    """Two passes of one copier (a fresh one unless given): Events written by each."""

    async def go() -> tuple[int, int]:
        kube = await KubeApi.connect(str(info.kubeconfig))
        c = copier or NodeEventCopier(kube, instance="tv-test")
        tenants = [
            tenant_api.from_object(await kube.get(custom("tenants"), n)) for n in (VISION, SPEECH)
        ]
        return await c.copy(tenants), await c.copy(tenants)

    return asyncio.run(go())


def _events(info: ClusterInfo, ns: str) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        kube = await KubeApi.connect(str(info.kubeconfig))
        found = await kube.list(
            EVENTS, namespace=ns, field_selector="reason=" + tenant_events.REASON
        )
        return list(found.items)

    return asyncio.run(go())


def test_the_tenants_hear_of_their_nodes_once(objects: ClusterInfo) -> None:
    info = objects
    work, owned = info.node_names[1], info.node_names[2]
    # Two incidents touch vision (its pod's node, its own node), in each of its namespaces.
    assert _copy(info) == (4, 0)
    for ns in (VISION, f"{VISION}-serve"):
        by_incident = {
            e["metadata"]["labels"][tenant_events.LABEL_INCIDENT]: e for e in _events(info, ns)
        }
        assert set(by_incident) == {"tv-work-xid", "tv-owned-xid"}
        ev = by_incident["tv-work-xid"]
        assert ev["type"] == "Warning" and ev["involvedObject"]["name"] == work
        assert ev["involvedObject"]["kind"] == "Node"
        assert f"node {work} is out for repair (xid-79: GPU 3 fell off the bus" in ev["message"]
        assert f"pods on it: {VISION}/train-0" in ev["message"]
        assert ev["metadata"]["labels"]["gpufleet.io/tenant"] == VISION
        assert ev["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpufleet"
        assert "own nodes" in by_incident["tv-owned-xid"]["message"]
        assert owned in by_incident["tv-owned-xid"]["message"]
    # speech's pod runs on a node with no incident: nothing in its namespace.
    assert _events(info, SPEECH) == []
    # A restarted controller (a new writer) finds them written: none again.
    assert _copy(info) == (0, 0)


def test_status_tenant_shows_its_nodes_gpus_and_incidents(objects: ClusterInfo) -> None:
    info = objects
    _copy(info)  # the Events (written by the test before, or now when run alone)
    work, owned = info.node_names[1], info.node_names[2]
    r = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "status", "--tenant", VISION,
         "--kubeconfig", str(info.kubeconfig), "-o", "json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["tenant"] == VISION and data["gpuQuota"] == 16 and data["problems"] == []
    nodes = {n["node"]: n for n in data["nodes"]}
    assert set(nodes) == {work, owned}
    assert (nodes[work]["gpus"], nodes[work]["pods"], nodes[work]["owned"]) == (2, 1, False)
    assert nodes[owned]["owned"] is True and nodes[owned]["gpus"] == 0
    incidents = {i["noderemediation"]: i for i in data["incidents"]}
    assert set(incidents) == {"tv-work-xid", "tv-owned-xid"}
    assert incidents["tv-work-xid"]["node"] == work
    assert incidents["tv-work-xid"]["phase"] == "Draining"
    missing = subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "status", "--tenant", "tv-nobody",
         "--kubeconfig", str(info.kubeconfig)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode != 0 and "no Tenant tv-nobody" in missing.stderr
