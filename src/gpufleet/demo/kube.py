"""Plain, synchronous access to the local cluster's apiserver for the demo.

The demo sets up what an operator would apply by hand (CRDs, the BMC Secrets
and each Node's ``gpufleet.io/bmc-secret`` annotation, the FleetPolicy) and
reads Nodes for its timeline. Everything else is done by the real components.
The calls go through :class:`gpufleet.kubeapi.sync.SyncKube` (a script, no event
loop); these functions are what the demo does with it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from gpufleet.domain import node_reports, well_known
from gpufleet.kubeapi.errors import ApiError, Conflict
from gpufleet.kubeapi.resources import Json, Patch
from gpufleet.kubeapi.secrets import encode_data
from gpufleet.kubeapi.sync import SyncKube
from gpufleet.local.cluster import BmcEndpoint, ClusterInfo

SYSTEM_NS = "gpufleet-system"
GV = f"/apis/{well_known.GROUP}/{well_known.VERSION}"
CRD_DIR = Path(__file__).resolve().parents[3] / "deploy" / "crds"
INFERENCE_CLASS = "inference-high"
INFERENCE_PRIORITY = 1_000_000


def connect(info: ClusterInfo) -> SyncKube:
    """The demo's client: the cluster's admin token and its CA."""
    return SyncKube(info.apiserver_url, info.token, info.ca_file)


def nodes(api: SyncKube) -> list[Json]:
    return list(api.get("/api/v1/nodes").get("items") or [])


def answered(api: SyncKube, path: str) -> Json | None:
    """The object at ``path``, or None when the apiserver answered anything but 200.

    For what the demo shows but does not need (a FleetPolicy's breaker, the
    NodeRemediations): a missing CRD or object is shown as nothing. No answer at
    all still raises, as for every other call.
    """
    try:
        return api.get(path)
    except ApiError as exc:
        if exc.status is None:
            raise
        return None


def wait(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        time.sleep(0.1)


def install(api: SyncKube) -> None:
    """CRDs (every file in deploy/crds), the namespace, the PriorityClass
    inference Pods use. Idempotent."""
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        name = crd["metadata"]["name"]
        wait(
            f"CRD {name} established",
            lambda n=name: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (
                    api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}").get(
                        "status"
                    )
                    or {}
                ).get("conditions")
                or []
            ),
        )
    api.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}},
    )
    api.create(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": INFERENCE_CLASS},
            "value": INFERENCE_PRIORITY,
            "description": "inference that may take GPU nodes from Slurm jobs",
        },
    )


def add_bmc_secrets(api: SyncKube, info: ClusterInfo) -> None:
    """One Secret per node with its BMC's endpoint and credentials, named by the Node."""
    for node, bmc in info.bmcs.items():
        if node in info.machines:
            continue  # a real machine's Node does not exist yet; its Machine names its BMC
        api.patch(
            f"/api/v1/nodes/{node}",
            {
                "metadata": {
                    "annotations": {well_known.ANNOTATION_BMC_SECRET: put_bmc_secret(api, bmc)}
                }
            },
        )


def put_bmc_secret(api: SyncKube, bmc: BmcEndpoint) -> str:
    """The Secret ``bmc-<node>`` with the BMC's endpoint and credentials; its reference
    (``namespace/name``, the ``gpufleet.io/bmc-secret`` format)."""
    name = f"bmc-{bmc.node}"
    data = encode_data({"endpoint": bmc.url, "username": bmc.user, "password": bmc.password})
    api.create(
        f"/api/v1/namespaces/{SYSTEM_NS}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data},
    )
    return f"{SYSTEM_NS}/{name}"


def remove_machine(api: SyncKube, name: str) -> None:
    """Forget a machine that joined in a scenario: its Node, its Machine, any join token
    still in ``kube-system`` and its BMC Secret. Idempotent."""
    api.delete(f"/api/v1/nodes/{name}")
    api.delete(f"{GV}/{well_known.MACHINE_PLURAL}/{name}")
    api.delete(
        f"/api/v1/namespaces/kube-system/secrets?labelSelector={well_known.LABEL_MACHINE}%3D{name}"
    )
    api.delete(f"/api/v1/namespaces/{SYSTEM_NS}/secrets/bmc-{name}")
    wait(f"Node {name} gone", lambda: not api.exists(f"/api/v1/nodes/{name}"))


def put_policy(api: SyncKube, body: dict[str, Any]) -> None:
    """Create the FleetPolicy afresh (a new object has no breaker or rate-limit history)."""
    path = f"{GV}/fleetpolicies/{body['metadata']['name']}"
    if api.exists(path):
        # The controller's finalizer would hold the delete while it is stopped.
        api.patch(path, {"metadata": {"finalizers": None}})
        api.delete(path)
        wait("old FleetPolicy gone", lambda: not api.exists(path))
    api.create(f"{GV}/fleetpolicies", body, exist_ok=False)


def reset_node(api: SyncKube, name: str, attempts: int = 10) -> None:
    """Forget every incident: gpufleet's marks, conditions, cordon and taints (not the
    BMC annotation). Used between scenarios, with the controller stopped; the syncer
    and KWOK still write the Node, so a conflicting write is retried."""
    for attempt in range(attempts):
        try:
            _reset_node(api, name)
            return
        except Conflict:
            if attempt == attempts - 1:
                raise
            time.sleep(0.1)


def _reset_node(api: SyncKube, name: str) -> None:
    node = api.get(f"/api/v1/nodes/{name}")
    ann = node["metadata"].get("annotations") or {}
    drop = {
        k: None
        for k in ann
        if k.startswith("gpufleet.io/") and k != well_known.ANNOTATION_BMC_SECRET
    }
    api.patch(
        f"/api/v1/nodes/{name}",
        {
            "metadata": {"annotations": drop, "labels": {well_known.LABEL_STATE: None}},
            "spec": {"unschedulable": None, "taints": None},
        },
    )
    ours = {
        *well_known.CONDITIONS.values(),
        *node_reports.LEGACY_CONDITIONS,
        well_known.CONDITION_SLURM,
    }
    node = api.get(f"/api/v1/nodes/{name}")
    conds = node.get("status", {}).get("conditions") or []
    drop_conds = [{"type": c["type"], "$patch": "delete"} for c in conds if c["type"] in ours]
    if drop_conds:
        # A strategic-merge delete by condition type: no resourceVersion, so the writers
        # still running (KWOK heartbeats, the syncer) cannot make it conflict.
        api.patch(
            f"/api/v1/nodes/{name}/status",
            {"status": {"conditions": drop_conds}},
            kind=Patch.STRATEGIC,
        )


def delete_remediations(api: SyncKube) -> None:
    api.delete(f"{GV}/noderemediations")
