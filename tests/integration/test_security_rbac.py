"""Least privilege, proved on the real apiserver with the chart's own RBAC applied.

The chart is rendered with helm (as in test_slurm_chart.py); its ServiceAccounts,
Roles, bindings, admission policies and the BMC namespace are applied for real
to the local cluster. Then:

- SubjectAccessReviews ask the apiserver's RBAC authorizer, for each service
  account, what it may and may not do (allowed and refused verbs);
- real requests, made with a pod-bound token of the agent (the token carries
  the node name, as in a real DaemonSet pod) or with impersonation of the
  other accounts, show what the ValidatingAdmissionPolicies add: the agent may
  change only its own Node; the controller and the provisioning service may
  touch only gpufleet's join tokens in kube-system;
- the SlurmCluster CRD refuses a line break in gpuType or features;
- deploy/ holds the same rules as the chart.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_slurm_chart import CHART, helm_binary, run

from gpufleet.local.cluster import ClusterInfo
from gpufleet.provision.issuer import token_secret

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
REL = "rbactest"
FULL = f"{REL}-gpufleet"  # the chart's object name prefix for this release
NS = "gpufleet-rbac-test"
BMC_NS = "gpufleet-rbac-bmc"
EVIDENCE_NS = "gpufleet-rbac-evidence"
SA = {
    name: f"system:serviceaccount:{NS}:{FULL}-{name}"
    for name in ("agent", "controller", "provisioning", "slurm-syncer")
}
APPLIED_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "Secret",
}
TEST_CONDITION = "GpufleetRbacTest"


def render(namespace: str, release: str, *extra: str) -> list[dict[str, Any]]:
    helm = helm_binary()
    assert helm is not None, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    out = run(
        helm, "template", release, str(CHART), "--namespace", namespace,
        "--set", "provisioning.enabled=true", *extra,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


class Client:
    """The admin's HTTP client, optionally acting as someone else."""

    def __init__(
        self, info: ClusterInfo, *, token: str | None = None, user: str | None = None
    ) -> None:
        self.http = httpx.Client(
            base_url=info.apiserver_url,
            verify=str(info.ca_file),
            headers={"Authorization": f"Bearer {token or info.token}"},
            timeout=30,
        )
        self._as: list[tuple[str, str]] = []
        if user is not None:  # a service account, with the groups its token would carry
            ns = user.split(":")[2]
            self._as = [
                ("Impersonate-User", user),
                ("Impersonate-Group", "system:serviceaccounts"),
                ("Impersonate-Group", f"system:serviceaccounts:{ns}"),
            ]

    def request(self, method: str, path: str, body: Any = None, kind: str = "") -> httpx.Response:
        headers = list(self._as)
        if kind:
            headers.append(("Content-Type", f"application/{kind}-patch+json"))
        return self.http.request(method, path, json=body, headers=headers)


@pytest.fixture(scope="module")
def admin(local_cluster: ClusterInfo) -> Client:
    return Client(local_cluster)


@pytest.fixture(scope="module")
def applied(local_cluster: ClusterInfo, admin: Client) -> Iterator[list[dict[str, Any]]]:
    """The chart's RBAC, admission policies, BMC namespace and Slurm key Secrets, applied."""
    kubectl, env = str(local_cluster.kubectl), local_cluster.kube_env()
    docs = render(
        NS, REL, "--set", f"bmcSecretsNamespace={BMC_NS}",
        "--set", f"controller.tickets.evidenceNamespace={EVIDENCE_NS}", "--include-crds",
    )  # fmt: skip
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    objs = [d for d in docs if d["kind"] in APPLIED_KINDS]
    run(
        kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-",
        env=env, stdin=yaml.safe_dump_all(crds),
    )  # fmt: skip
    run(kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s", env=env)
    subprocess.run([kubectl, "create", "namespace", NS], env=env, capture_output=True)
    run(kubectl, "apply", "-f", "-", env=env, stdin=yaml.safe_dump_all(objs))
    try:
        yield objs
    finally:
        cluster_scoped = [
            d
            for d in objs
            if d["kind"]
            in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding")
            or d["metadata"].get("namespace") == "kube-system"
        ]  # fmt: skip
        subprocess.run(
            [kubectl, "delete", "--ignore-not-found", "-f", "-"],
            env=env, input=yaml.safe_dump_all(cluster_scoped), capture_output=True, text=True,
        )  # fmt: skip
        for ns in (NS, BMC_NS, EVIDENCE_NS):
            subprocess.run(
                [kubectl, "delete", "namespace", ns, "--wait=false"], env=env, capture_output=True
            )


def can(admin: Client, who: str, verb: str, resource: str, *, ns: str = "", name: str = "") -> bool:
    """The RBAC authorizer's answer (SubjectAccessReview) for a service account."""
    kind, _, sub = resource.partition("/")  # "machines.gpufleet.io/status"
    res, _, group = kind.partition(".")
    attrs = {"verb": verb, "group": group, "resource": res, "subresource": sub}
    if ns:
        attrs["namespace"] = ns
    if name:
        attrs["name"] = name
    user = SA[who]
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NS}",
                       "system:authenticated"],
            "resourceAttributes": attrs,
        },
    }  # fmt: skip
    r = admin.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
    assert r.status_code == 201, r.text
    return bool(r.json()["status"].get("allowed"))


# (service account, verb, resource[/subresource][.group], namespace, name, allowed)
JWT, MUNGE = f"{FULL}-slurm-jwt", f"{FULL}-munge-key"
MATRIX: list[tuple[str, str, str, str, str, bool]] = [
    # agent: read Nodes and pods, patch Node status (own node: admission), Events.
    ("agent", "get", "nodes", "", "", True),
    ("agent", "watch", "nodes", "", "", True),
    ("agent", "patch", "nodes/status", "", "", True),
    ("agent", "list", "pods", "", "", True),
    ("agent", "get", "pods", "default", "", True),
    ("agent", "create", "events", "default", "", True),
    ("agent", "patch", "nodes", "", "", False),
    ("agent", "update", "nodes", "", "", False),
    ("agent", "delete", "nodes", "", "", False),
    ("agent", "delete", "pods", "default", "", False),
    ("agent", "create", "pods/eviction", "default", "", False),
    ("agent", "get", "secrets", NS, "", False),
    ("agent", "patch", "fleetpolicies.gpufleet.io", "", "", False),
    # the agent judges with the controller's FleetPolicy: read it, never write it
    ("agent", "get", "fleetpolicies.gpufleet.io", "", "default", True),
    ("agent", "watch", "fleetpolicies.gpufleet.io", "", "", True),
    ("agent", "update", "fleetpolicies.gpufleet.io/status", "", "", False),
    ("agent", "delete", "fleetpolicies.gpufleet.io", "", "", False),
    # controller
    ("controller", "list", "nodes", "", "", True),
    ("controller", "watch", "nodes", "", "", True),
    ("controller", "patch", "nodes", "", "", True),
    ("controller", "patch", "nodes/status", "", "", True),
    ("controller", "delete", "nodes", "", "", False),
    ("controller", "list", "pods", "", "", True),
    ("controller", "get", "pods", "default", "", True),
    ("controller", "delete", "pods", "default", "", True),
    ("controller", "create", "pods/eviction", "default", "", True),
    ("controller", "create", "pods", "default", "", False),
    ("controller", "create", "events", "default", "", True),
    ("controller", "patch", "events", "default", "", True),
    ("controller", "watch", "fleetpolicies.gpufleet.io", "", "", True),
    ("controller", "patch", "fleetpolicies.gpufleet.io", "", "", True),
    ("controller", "patch", "fleetpolicies.gpufleet.io/status", "", "", True),
    ("controller", "delete", "fleetpolicies.gpufleet.io", "", "", False),
    ("controller", "create", "noderemediations.gpufleet.io", "", "", True),
    ("controller", "watch", "noderemediations.gpufleet.io", "", "", True),
    ("controller", "patch", "noderemediations.gpufleet.io/status", "", "", True),
    ("controller", "delete", "noderemediations.gpufleet.io", "", "", False),
    ("controller", "get", "machines.gpufleet.io", "", "", True),
    ("controller", "watch", "machines.gpufleet.io", "", "", True),
    ("controller", "patch", "machines.gpufleet.io", "", "", True),
    ("controller", "patch", "machines.gpufleet.io/status", "", "", True),
    ("controller", "create", "machines.gpufleet.io", "", "", False),
    ("controller", "delete", "machines.gpufleet.io", "", "", False),
    ("controller", "watch", "maintenanceplans.gpufleet.io", "", "", True),
    ("controller", "patch", "maintenanceplans.gpufleet.io/status", "", "", True),
    ("controller", "patch", "maintenanceplans.gpufleet.io", "", "", False),
    ("controller", "delete", "maintenanceplans.gpufleet.io", "", "", False),
    # its Lease (one acting replica) and its record signing key, in its own namespace only
    ("controller", "create", "leases.coordination.k8s.io", NS, "", True),
    ("controller", "patch", "leases.coordination.k8s.io", NS, f"{FULL}-controller", True),
    ("controller", "patch", "leases.coordination.k8s.io", NS, "kube-scheduler", False),
    ("controller", "patch", "leases.coordination.k8s.io", "kube-system", "", False),
    ("controller", "get", "secrets", NS, f"{FULL}-record-key", True),
    ("controller", "create", "secrets", NS, "", True),
    ("controller", "get", "secrets", NS, "another-secret", False),
    ("agent", "get", "secrets", NS, f"{FULL}-record-key", False),
    ("slurm-syncer", "get", "secrets", NS, f"{FULL}-record-key", False),
    ("controller", "get", "secrets", BMC_NS, "node-0-bmc", True),
    ("controller", "list", "secrets", BMC_NS, "", False),
    ("controller", "get", "secrets", NS, JWT, False),
    ("controller", "get", "secrets", NS, MUNGE, False),
    ("controller", "list", "secrets", NS, "", False),
    ("controller", "get", "secrets", "kube-system", "bootstrap-token-abcdef", False),
    ("controller", "list", "secrets", "kube-system", "", False),
    ("controller", "delete", "secrets", "kube-system", "bootstrap-token-abcdef", True),
    ("controller", "get", "configmaps", NS, "", False),
    ("controller", "create", "configmaps", EVIDENCE_NS, "", True),
    ("controller", "get", "configmaps", EVIDENCE_NS, "", True),
    ("controller", "delete", "configmaps", EVIDENCE_NS, "", True),
    ("controller", "list", "configmaps", EVIDENCE_NS, "", False),
    ("controller", "create", "configmaps", NS, "", False),
    ("controller", "create", "configmaps", "kube-system", "", False),
    ("controller", "list", "events", "default", "", True),
    # provisioning service
    ("provisioning", "list", "machines.gpufleet.io", "", "", True),
    ("provisioning", "watch", "machines.gpufleet.io", "", "", True),
    ("provisioning", "patch", "machines.gpufleet.io/status", "", "", True),
    ("provisioning", "patch", "machines.gpufleet.io", "", "", False),
    ("provisioning", "create", "machines.gpufleet.io", "", "", False),
    ("provisioning", "create", "secrets", "kube-system", "", True),
    ("provisioning", "get", "secrets", "kube-system", "bootstrap-token-abcdef", False),
    ("provisioning", "delete", "secrets", "kube-system", "bootstrap-token-abcdef", False),
    ("provisioning", "get", "secrets", BMC_NS, "node-0-bmc", True),
    ("provisioning", "get", "secrets", NS, JWT, False),
    ("provisioning", "create", "events", "default", "", True),
    ("provisioning", "patch", "nodes", "", "", False),
    # Slurm syncer and SlurmCluster operator
    ("slurm-syncer", "watch", "nodes", "", "", True),
    ("slurm-syncer", "patch", "nodes", "", "", True),
    ("slurm-syncer", "patch", "nodes/status", "", "", True),
    ("slurm-syncer", "watch", "pods", "", "", True),
    ("slurm-syncer", "create", "pods/binding", "default", "", True),
    ("slurm-syncer", "delete", "pods", "default", "", False),
    ("slurm-syncer", "delete", "pods", NS, "", True),  # the slurmd roll
    ("slurm-syncer", "get", "daemonsets.apps", NS, f"{FULL}-slurmd", True),
    ("slurm-syncer", "get", "daemonsets.apps", NS, f"{FULL}-agent", False),
    ("slurm-syncer", "patch", "daemonsets.apps", NS, f"{FULL}-slurmd", False),
    ("slurm-syncer", "list", "slurmclusters.gpufleet.io", "", "", True),
    ("slurm-syncer", "patch", "slurmclusters.gpufleet.io/status", "", "", True),
    ("slurm-syncer", "patch", "slurmclusters.gpufleet.io", "", "", False),
    ("slurm-syncer", "list", "maintenanceplans.gpufleet.io", "", "", True),
    ("slurm-syncer", "patch", "maintenanceplans.gpufleet.io/status", "", "", False),
    ("slurm-syncer", "patch", "configmaps", NS, "gpufleet-slurm-config", True),
    ("slurm-syncer", "create", "configmaps", NS, "", True),
    ("slurm-syncer", "patch", "configmaps", "kube-system", "", False),
    ("slurm-syncer", "get", "secrets", NS, JWT, False),
    ("slurm-syncer", "get", "secrets", NS, MUNGE, False),
    ("slurm-syncer", "patch", "fleetpolicies.gpufleet.io", "", "", False),
    ("slurm-syncer", "create", "events", "default", "", True),  # topology contradictions
]


def test_rbac_allows_exactly_what_each_service_account_needs(
    admin: Client, applied: list[dict[str, Any]]
) -> None:
    wrong = [
        f"{who} {verb} {res} ns={ns or '-'} name={name or '-'}: "
        f"{'refused' if expected else 'ALLOWED'}"
        for who, verb, res, ns, name, expected in MATRIX
        if can(admin, who, verb, res, ns=ns, name=name) != expected
    ]
    assert not wrong, "\n".join(wrong)


def eventually(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Admission policies take effect a moment after they are created."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def _condition_patch(status: str = "False") -> dict[str, Any]:
    return {
        "status": {
            "conditions": [
                {"type": TEST_CONDITION, "status": status, "reason": "Test", "message": "rbac"}
            ]
        }
    }


@pytest.fixture(scope="module")
def agent_token(
    local_cluster: ClusterInfo, admin: Client, applied: list[dict[str, Any]]
) -> Iterator[tuple[str, str]]:
    """(token, node): a token bound to an agent pod on the first node, as the kubelet gets it."""
    node = local_cluster.node_names[0]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "agent-probe", "namespace": NS},
        "spec": {
            "serviceAccountName": f"{FULL}-agent",
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "agent", "image": "gpufleet:test"}],
        },
    }
    r = admin.request("POST", f"/api/v1/namespaces/{NS}/pods", pod)
    assert r.status_code == 201, r.text
    uid = r.json()["metadata"]["uid"]
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "agent-probe",
                "uid": uid,
            },
        },
    }
    r = admin.request(
        "POST", f"/api/v1/namespaces/{NS}/serviceaccounts/{FULL}-agent/token", request
    )
    assert r.status_code == 201, r.text
    try:
        yield r.json()["status"]["token"], node
    finally:
        for name in local_cluster.node_names[:2]:
            admin.request(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {
                    "metadata": {"annotations": {"gpufleet.io/agent-result": None}},
                    "status": {"conditions": [{"type": TEST_CONDITION, "$patch": "delete"}]},
                },
                kind="strategic-merge",
            )
        admin.request("DELETE", f"/api/v1/namespaces/{NS}/pods/agent-probe?gracePeriodSeconds=0")


def test_agent_changes_only_its_own_node(
    local_cluster: ClusterInfo, admin: Client, agent_token: tuple[str, str]
) -> None:
    token, own = agent_token
    other = next(n for n in local_cluster.node_names if n != own)
    agent = Client(local_cluster, token=token)
    review = agent.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    ).json()["status"]["userInfo"]
    assert review["username"] == SA["agent"]
    assert review["extra"]["authentication.kubernetes.io/node-name"] == [own]

    def other_refused() -> bool:
        r = agent.request(
            "PATCH", f"/api/v1/nodes/{other}/status", _condition_patch(), kind="strategic-merge"
        )
        return r.status_code == 403 and "may only change the Node it runs on" in r.text

    eventually(other_refused, "the agent's own-node admission policy")
    r = agent.request(
        "PATCH", f"/api/v1/nodes/{own}/status", _condition_patch("True"), kind="strategic-merge"
    )
    assert r.status_code == 200, r.text
    conditions = {c["type"]: c for c in r.json()["status"]["conditions"]}
    assert conditions[TEST_CONDITION]["status"] == "True"
    # Its own Node's labels, taints or cordon: not even that (RBAC: no patch on nodes).
    r = agent.request(
        "PATCH", f"/api/v1/nodes/{own}", {"spec": {"unschedulable": True}}, kind="merge"
    )
    assert r.status_code == 403, r.text
    # The apiserver takes a Node's metadata through its status subresource: the agent may
    # write its own keys there (hardware and request-answer annotations, NVLink topology
    # labels), and nothing else.
    mine = {"metadata": {"annotations": {"gpufleet.io/agent-result": '{"id":"t"}'}}}
    r = agent.request("PATCH", f"/api/v1/nodes/{own}/status", mine, kind="strategic-merge")
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["annotations"]["gpufleet.io/agent-result"] == '{"id":"t"}'
    # The NVLink and InfiniBand leaf topology labels, as KubeReporter.set_labels writes
    # and removes them.
    cluster = "dc6e40c4-d722-4357-9ba6-5291dd461278"
    topology = {
        "gpufleet.io/nvlink-cluster": cluster,
        "gpufleet.io/nvlink-clique": f"{cluster}.2",
        "gpufleet.io/ib-seen-leaf": "0xfc6a1c0300e7a940",
        "gpufleet.io/ib-seen-leaf-name": "leaf-07",
    }
    r = agent.request(
        "PATCH", f"/api/v1/nodes/{own}/status", {"metadata": {"labels": topology}}, kind="merge"
    )
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["labels"]["gpufleet.io/nvlink-clique"] == f"{cluster}.2"
    gone = {"metadata": {"labels": dict.fromkeys(topology)}}
    r = agent.request("PATCH", f"/api/v1/nodes/{own}/status", gone, kind="merge")
    assert r.status_code == 200, r.text
    assert not set(topology) & set(r.json()["metadata"].get("labels") or {})
    for forged in (
        {"metadata": {"labels": {"gpufleet.io/state": "forged-by-the-agent"}}},
        {"metadata": {"annotations": {"gpufleet.io/record": "{}"}}},
        {"metadata": {"annotations": {"gpufleet.io/bmc-secret": "elsewhere/bmc"}}},
    ):
        r = agent.request("PATCH", f"/api/v1/nodes/{own}/status", forged, kind="strategic-merge")
        # Refused by its own-node policy, or for the record by the controller-records one.
        assert r.status_code == 403 and (
            "may change only its own labels" in r.text
            or "only the gpufleet lifecycle controller" in r.text
        ), forged
    # Reading the pods on its node (the "node has work" check) is allowed.
    r = agent.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{own}")
    assert r.status_code == 200 and any(
        p["metadata"]["name"] == "agent-probe" for p in r.json()["items"]
    )


def test_only_the_controller_writes_a_nodes_record_mark_and_request(
    local_cluster: ClusterInfo, admin: Client, agent_token: tuple[str, str]
) -> None:
    """Defect 2 of issue 33: the record, the write-ahead mark and the agent request (and
    their signatures) are written by the controller's account alone (decision 0144). The
    syncer's account may patch Nodes (its taint) and the admin may patch anything: neither
    may change these keys; the controller may."""
    node = local_cluster.node_names[1]
    token, own = agent_token
    keys = (
        "gpufleet.io/record",
        "gpufleet.io/record-signature",
        "gpufleet.io/bmc-action",
        "gpufleet.io/bmc-action-signature",
        "gpufleet.io/agent-request",
    )
    syncer = Client(local_cluster, user=SA["slurm-syncer"])
    controller = Client(local_cluster, user=SA["controller"])
    agent = Client(local_cluster, token=token)

    def forged(key: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {key: '{"forged": true}'}}}

    def refused(who: Client, path: str, key: str) -> bool:
        r = who.request("PATCH", path, forged(key), kind="merge")
        return r.status_code == 403 and "only the gpufleet lifecycle controller" in r.text

    eventually(
        lambda: refused(syncer, f"/api/v1/nodes/{node}", keys[0]),
        "the controller-records admission policy",
    )
    for key in keys:
        assert refused(syncer, f"/api/v1/nodes/{node}", key), key
        assert refused(admin, f"/api/v1/nodes/{node}", key), key
        r = agent.request("PATCH", f"/api/v1/nodes/{own}/status", forged(key), kind="merge")
        assert r.status_code == 403, (key, r.text)
    # The syncer's own write (an annotation of its own) still goes through.
    r = syncer.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"metadata": {"annotations": {"gpufleet.io/slurm-state": "rbac-test"}}},
        kind="merge",
    )
    assert r.status_code == 200, r.text
    # The controller writes and removes them.
    for key in keys:
        r = controller.request("PATCH", f"/api/v1/nodes/{node}", forged(key), kind="merge")
        assert r.status_code == 200, (key, r.text)
    gone = {"metadata": {"annotations": {k: None for k in (*keys, "gpufleet.io/slurm-state")}}}
    r = controller.request("PATCH", f"/api/v1/nodes/{node}", gone, kind="merge")
    assert r.status_code == 200, r.text
    assert not set(keys) & set(r.json()["metadata"].get("annotations") or {})


def test_agent_token_without_a_node_is_refused(
    local_cluster: ClusterInfo, agent_token: tuple[str, str]
) -> None:
    """The agent's account used outside a pod (no node in its token): fails closed."""
    impersonated = Client(local_cluster, user=SA["agent"])
    own = agent_token[1]
    r = impersonated.request(
        "PATCH", f"/api/v1/nodes/{own}/status", _condition_patch(), kind="strategic-merge"
    )
    assert r.status_code == 403 and "may only change the Node it runs on" in r.text, r.text


def _secret(name: str, ns: str, *, type_: str = "Opaque", labels: dict[str, str] | None = None):
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": type_,
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "stringData": {"k": "v"},
    }


def _bootstrap(token_id: str, machine: str | None) -> dict[str, Any]:
    body = token_secret(machine or "m0", token_id, "0123456789abcdef", time.time() + 600)
    if machine is None:
        body["metadata"]["labels"] = {}
    return body


@pytest.fixture(scope="module")
def join_token_policy_active(
    local_cluster: ClusterInfo, admin: Client, applied: list[dict[str, Any]]
) -> None:
    """Wait until the join-token admission policy refuses; nothing it guards is changed first."""
    provisioning = Client(local_cluster, user=SA["provisioning"])
    probe = _secret("gpufleet-rbac-probe", "kube-system")

    def refused() -> bool:
        r = provisioning.request("POST", "/api/v1/namespaces/kube-system/secrets", probe)
        if r.status_code == 201:  # not active yet: undo and ask again
            admin.request("DELETE", "/api/v1/namespaces/kube-system/secrets/gpufleet-rbac-probe")
            return False
        return r.status_code == 403 and "only the join tokens it issues" in r.text

    eventually(refused, "the join-token admission policy")


def test_controller_reads_bmc_secrets_but_never_the_slurm_keys(
    local_cluster: ClusterInfo, admin: Client, applied: list[dict[str, Any]]
) -> None:
    r = admin.request("POST", f"/api/v1/namespaces/{BMC_NS}/secrets", _secret("node-0-bmc", BMC_NS))
    assert r.status_code in (201, 409), r.text
    controller = Client(local_cluster, user=SA["controller"])
    assert controller.request("GET", f"/api/v1/namespaces/{BMC_NS}/secrets/node-0-bmc").is_success
    for name in (JWT, MUNGE):
        # The chart renders no Slurm key: the controller makes them once (create-only,
        # decision 0188); here they exist, as after its first start or an operator's own.
        r = admin.request("POST", f"/api/v1/namespaces/{NS}/secrets", _secret(name, NS))
        assert r.status_code in (201, 409), r.text
        r = controller.request("GET", f"/api/v1/namespaces/{NS}/secrets/{name}")
        assert r.status_code == 403, f"controller read {name}: {r.status_code}"
    # A bmc-secret annotation pointing elsewhere cannot reach another namespace's Secrets.
    r = controller.request("GET", "/api/v1/namespaces/kube-system/secrets")
    assert r.status_code == 403


def test_controller_revokes_gpufleet_join_tokens_and_nothing_else(
    local_cluster: ClusterInfo, admin: Client, join_token_policy_active: None
) -> None:
    controller = Client(local_cluster, user=SA["controller"])
    ours = _bootstrap("rbac01", "gpufleet-rbac-m0")
    foreign = _bootstrap("rbac02", None)  # e.g. kubeadm's own token
    victim = _secret("gpufleet-rbac-victim", "kube-system")
    try:
        for body in (ours, foreign, victim):
            r = admin.request("POST", "/api/v1/namespaces/kube-system/secrets", body)
            assert r.status_code == 201, r.text
        base = "/api/v1/namespaces/kube-system/secrets"
        r = controller.request("DELETE", f"{base}/bootstrap-token-rbac01")
        assert r.status_code == 200, r.text
        for name in ("bootstrap-token-rbac02", "gpufleet-rbac-victim"):
            r = controller.request("DELETE", f"{base}/{name}")
            assert r.status_code == 403 and "only the join tokens it issues" in r.text, r.text
            assert admin.request("GET", f"{base}/{name}").is_success
    finally:
        for name in ("bootstrap-token-rbac01", "bootstrap-token-rbac02", "gpufleet-rbac-victim"):
            admin.request("DELETE", f"/api/v1/namespaces/kube-system/secrets/{name}")


def test_provisioning_creates_join_tokens_and_no_other_secret(
    local_cluster: ClusterInfo, admin: Client, join_token_policy_active: None
) -> None:
    provisioning = Client(local_cluster, user=SA["provisioning"])
    base = "/api/v1/namespaces/kube-system/secrets"
    sa_token = _secret(
        "gpufleet-rbac-sa-token", "kube-system", type_="kubernetes.io/service-account-token"
    )
    sa_token["metadata"]["annotations"] = {
        "kubernetes.io/service-account.name": "namespace-controller"
    }
    try:
        r = provisioning.request("POST", base, _bootstrap("rbac03", "gpufleet-rbac-m0"))
        assert r.status_code == 201, r.text
        r = provisioning.request("POST", base, sa_token)
        assert r.status_code == 403 and "only the join tokens it issues" in r.text, r.text
        r = provisioning.request("DELETE", f"{base}/bootstrap-token-rbac03")
        assert r.status_code == 403  # revoking is the controller's (RBAC)
    finally:
        for name in ("bootstrap-token-rbac03", "gpufleet-rbac-sa-token"):
            admin.request("DELETE", f"{base}/{name}")


def test_controller_records_on_machines(
    local_cluster: ClusterInfo, admin: Client, applied: list[dict[str, Any]]
) -> None:
    machine = {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": "gpufleet-rbac-m0"},
        "spec": {
            "macs": ["aa:bb:cc:dd:ee:01"],
            "serial": "RBAC0",
            "bmc": {"endpoint": "https://127.0.0.1:1", "credentialsSecret": f"{BMC_NS}/m0"},
            "hardware": {"gpuModel": "H100", "gpuCount": 8, "hcaCount": 8},
        },
    }
    path = "/apis/gpufleet.io/v1alpha1/machines"
    r = admin.request("POST", path, machine)
    assert r.status_code == 201, r.text
    try:
        controller = Client(local_cluster, user=SA["controller"])
        r = controller.request(
            "PATCH", f"{path}/gpufleet-rbac-m0/status", {"status": {"phase": "Joined"}}, "merge"
        )
        assert r.status_code == 200, r.text
        provisioning = Client(local_cluster, user=SA["provisioning"])
        r = provisioning.request(
            "PATCH", f"{path}/gpufleet-rbac-m0", {"metadata": {"labels": {"x": "y"}}}, "merge"
        )
        assert r.status_code == 403
    finally:
        admin.request("DELETE", f"{path}/gpufleet-rbac-m0")


def test_slurm_pods_mount_no_token_and_gpufleet_pods_use_their_accounts() -> None:
    docs = render(NS, REL, "--set", "slurm.accounting.enabled=true")
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]
    accounts = {}
    for w in workloads:
        spec = w["spec"]["template"]["spec"]
        accounts[w["metadata"]["name"]] = (
            spec.get("serviceAccountName"),
            spec.get("automountServiceAccountToken", True),
        )
    gpufleet = {f"{FULL}-agent", f"{FULL}-controller", f"{FULL}-slurm-syncer"}
    for name, (account, mounted) in accounts.items():
        if name in gpufleet:
            assert account == name and mounted, name
        else:
            assert account is None and mounted is False, f"{name} mounts an API token"
    assert len(accounts) > len(gpufleet)


def test_bmc_namespace_may_not_be_the_release_namespace() -> None:
    helm = helm_binary()
    assert helm is not None
    r = subprocess.run(
        [helm, "template", REL, str(CHART), "-n", "gpufleet-system",
         "--set", "bmcSecretsNamespace=gpufleet-system"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode != 0 and "must be a namespace of its own" in r.stderr


@pytest.mark.parametrize("namespace", ["gpufleet-system", "kube-system"])
def test_evidence_namespace_may_not_be_the_release_namespace(namespace: str) -> None:
    helm = helm_binary()
    assert helm is not None
    r = subprocess.run(
        [helm, "template", REL, str(CHART), "-n", "gpufleet-system",
         "--set", f"controller.tickets.evidenceNamespace={namespace}"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert r.returncode != 0 and "evidenceNamespace" in r.stderr
    assert "must be a namespace of its own" in r.stderr


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpuType", "h100\nPrologSlurmctld=/tmp/evil"), ("features", ["ib\nPrologSlurmctld=/x"])],
)
def test_apiserver_refuses_slurm_config_injection(
    admin: Client, applied: list[dict[str, Any]], field: str, value: Any
) -> None:
    pool = {"name": "gpu", "gpuType": "h100", "features": ["ib"]}
    body = {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "SlurmCluster",
        "metadata": {"name": "injected", "namespace": NS},
        "spec": {
            "nodePools": [{**pool, field: value}],
            "partitions": [{"name": "batch", "pools": ["gpu"]}],
        },
    }
    path = f"/apis/gpufleet.io/v1alpha1/namespaces/{NS}/slurmclusters?dryRun=All"
    r = admin.request("POST", path, body)
    assert r.status_code == 422, r.text
    assert f"spec.nodePools[0].{field}" in r.json()["message"]
    body["spec"]["nodePools"] = [pool]
    assert admin.request("POST", path, body).status_code == 201


def _rules_by_account(docs: list[dict[str, Any]]) -> dict[tuple[str, str], list[Any]]:
    """(account, role namespace or '*') -> sorted normalized rules, from roles and bindings."""
    roles = {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d.get("rules", [])
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    out: dict[tuple[str, str], list[Any]] = {}
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ns = b["metadata"].get("namespace", "")
        rules = roles[(b["roleRef"]["kind"], ns if b["roleRef"]["kind"] == "Role" else "",
                       b["roleRef"]["name"])]  # fmt: skip
        for s in b["subjects"]:
            key = (s["name"], ns or "*")
            out.setdefault(key, [])
            for rule in rules:
                out[key] += [
                    (g, res, verb, tuple(rule.get("resourceNames", [])))
                    for g in rule["apiGroups"]
                    for res in rule["resources"]
                    for verb in rule["verbs"]
                ]
    return {k: sorted(v) for k, v in out.items()}


def _policies(docs: list[dict[str, Any]], release: str) -> dict[str, Any]:
    return {
        d["metadata"]["name"].removeprefix(f"{release}-"): d["spec"]
        for d in docs
        if d["kind"].startswith("ValidatingAdmissionPolicy")
    }


def test_deploy_manifests_hold_the_charts_rules() -> None:
    chart = render("gpufleet-system", "gpufleet")
    plain = [
        d
        for f in sorted((ROOT / "deploy").glob("*/*.yaml"))
        if f.parent.name in ("rbac", "controller")
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]
    chart_rules = _rules_by_account(chart)
    # Same accounts, same rules, in the same namespaces (the chart's default
    # bmcSecretsNamespace is the plain manifests' gpufleet-bmc).
    assert chart_rules == _rules_by_account(plain)
    assert _policies(chart, "gpufleet") == _policies(plain, "gpufleet")
    sas = {d["metadata"]["name"] for d in chart if d["kind"] == "ServiceAccount"}
    assert sas == {d["metadata"]["name"] for d in plain if d["kind"] == "ServiceAccount"}
