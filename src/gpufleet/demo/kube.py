"""Plain, synchronous access to the local cluster's apiserver for the demo.

The demo sets up what an operator would apply by hand (CRDs, the BMC Secrets
and each Node's ``gpufleet.io/bmc-secret`` annotation, the FleetPolicy) and
reads Nodes for its timeline. Everything else is done by the real components.
"""

from __future__ import annotations

import base64
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpufleet.domain import well_known
from gpufleet.local.cluster import BmcEndpoint, ClusterInfo

SYSTEM_NS = "gpufleet-system"
GV = f"/apis/{well_known.GROUP}/{well_known.VERSION}"
CRD_DIR = Path(__file__).resolve().parents[3] / "deploy" / "crds"
INFERENCE_CLASS = "inference-high"
INFERENCE_PRIORITY = 1_000_000


class Kube:
    """Bearer-token HTTP to the apiserver (the cluster's own CA)."""

    def __init__(self, info: ClusterInfo) -> None:
        self.http = httpx.Client(
            base_url=info.apiserver_url,
            verify=ssl.create_default_context(cafile=str(info.ca_file)),
            headers={"Authorization": f"Bearer {info.token}"},
            timeout=10,
        )

    def close(self) -> None:
        self.http.close()

    def get(self, path: str) -> Any:
        r = self.http.get(path)
        r.raise_for_status()
        return r.json()

    def exists(self, path: str) -> bool:
        return self.http.get(path).status_code == 200

    def post(self, path: str, body: Any, ok: tuple[int, ...] = (200, 201, 409)) -> Any:
        r = self.http.post(path, json=body)
        if r.status_code not in ok:
            raise RuntimeError(f"POST {path}: HTTP {r.status_code} {r.text[:300]}")
        return r.json()

    def patch(self, path: str, body: Any, kind: str = "merge") -> Any:
        r = self.http.patch(
            path, json=body, headers={"Content-Type": f"application/{kind}-patch+json"}
        )
        if r.status_code != 200:
            raise RuntimeError(f"PATCH {path}: HTTP {r.status_code} {r.text[:300]}")
        return r.json()

    def delete(self, path: str) -> None:
        self.http.delete(path)

    def nodes(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v1/nodes").get("items") or [])


def wait(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        time.sleep(0.1)


def install(api: Kube) -> None:
    """CRDs (every file in deploy/crds), the namespace, the PriorityClass
    inference Pods use. Idempotent."""
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
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
    api.post(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}},
    )
    api.post(
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": INFERENCE_CLASS},
            "value": INFERENCE_PRIORITY,
            "description": "inference that may take GPU nodes from Slurm jobs",
        },
    )


def add_bmc_secrets(api: Kube, info: ClusterInfo) -> None:
    """One Secret per node with its BMC's endpoint and credentials, named by the Node."""
    for node, bmc in info.bmcs.items():
        api.patch(
            f"/api/v1/nodes/{node}",
            {
                "metadata": {
                    "annotations": {well_known.ANNOTATION_BMC_SECRET: put_bmc_secret(api, bmc)}
                }
            },
        )


def put_bmc_secret(api: Kube, bmc: BmcEndpoint) -> str:
    """The Secret ``bmc-<node>`` with the BMC's endpoint and credentials; its reference
    (``namespace/name``, the ``gpufleet.io/bmc-secret`` format)."""
    name = f"bmc-{bmc.node}"
    data = {
        k: base64.b64encode(v.encode()).decode()
        for k, v in {"endpoint": bmc.url, "username": bmc.user, "password": bmc.password}.items()
    }
    api.post(
        f"/api/v1/namespaces/{SYSTEM_NS}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data},
    )
    return f"{SYSTEM_NS}/{name}"


def remove_machine(api: Kube, name: str) -> None:
    """Forget a machine that joined in a scenario: its Node, its Machine, any join token
    still in ``kube-system`` and its BMC Secret. Idempotent."""
    api.delete(f"/api/v1/nodes/{name}")
    api.delete(f"{GV}/{well_known.MACHINE_PLURAL}/{name}")
    api.delete(
        f"/api/v1/namespaces/kube-system/secrets?labelSelector={well_known.LABEL_MACHINE}%3D{name}"
    )
    api.delete(f"/api/v1/namespaces/{SYSTEM_NS}/secrets/bmc-{name}")
    wait(f"Node {name} gone", lambda: not api.exists(f"/api/v1/nodes/{name}"))


def put_policy(api: Kube, body: dict[str, Any]) -> None:
    """Create the FleetPolicy afresh (a new object has no breaker or rate-limit history)."""
    path = f"{GV}/fleetpolicies/{body['metadata']['name']}"
    if api.exists(path):
        # The controller's finalizer would hold the delete while it is stopped.
        api.patch(path, {"metadata": {"finalizers": None}})
        api.delete(path)
        wait("old FleetPolicy gone", lambda: not api.exists(path))
    api.post(f"{GV}/fleetpolicies", body, ok=(201,))


def reset_node(api: Kube, name: str, attempts: int = 10) -> None:
    """Forget every incident: gpufleet's marks, conditions, cordon and taints (not the
    BMC annotation). Used between scenarios, with the controller stopped; the syncer
    and KWOK still write the Node, so a conflicting write is retried."""
    for attempt in range(attempts):
        try:
            _reset_node(api, name)
            return
        except RuntimeError as exc:
            if "HTTP 409" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.1)


def _reset_node(api: Kube, name: str) -> None:
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
        well_known.CONDITION_REQUEST,
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
            kind="strategic-merge",
        )


def delete_remediations(api: Kube) -> None:
    api.delete(f"{GV}/noderemediations")
