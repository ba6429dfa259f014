"""Tenants' boundaries on the real apiserver: what one tenant's people may do in another's
namespaces, asked of the RBAC authorizer (SubjectAccessReview) and tried for real
(impersonation), with the objects the tenant controller writes
(:func:`gpufleet.domain.tenancy.desired_objects`) applied as they are.

A tenant's user reads and writes its own namespaces' Secrets, pods' logs and exec, and
nothing of the other tenant's; cannot raise its own GPU quota, grant itself or anyone more
(RoleBindings) nor change a Tenant. The NetworkPolicy is accepted by the apiserver as
written; that traffic is refused needs a network plugin that enforces policies, which the
local cluster's nodes have not (docs/tenants.md, Isolation). Uses the session's cluster: two
namespaces and their objects, about 2 s.
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from test_slurm_chart import run

from gpufleet.domain import tenancy
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

VISION = tenancy.Tenant(
    name="bnd-vision",
    created="2026-01-01T00:00:00Z",
    namespaces=("bnd-vision", "bnd-vision-serve"),
    users=(tenancy.User("bnd-alice", 20001, 20001),),
    groups=("bnd-vision-admins",),
    gpu_quota=4,
)
SPEECH = tenancy.Tenant(
    name="bnd-speech",
    created="2026-01-02T00:00:00Z",
    namespaces=("bnd-speech",),
    users=(tenancy.User("bnd-bob", 20002, 20002),),
    gpu_quota=2,
)
TENANTS = (VISION, SPEECH)
SECRET = "bnd-token"


def _objects(t: tenancy.Tenant) -> list[dict[str, Any]]:
    usage = tenancy.Usage({ns: 0 for ns in t.namespaces}, 0)
    out = []
    for o in tenancy.desired_objects(t, tenancy.split(t.gpu_quota, usage)):
        api = {
            "ResourceQuota": "v1",
            "RoleBinding": "rbac.authorization.k8s.io/v1",
            "NetworkPolicy": "networking.k8s.io/v1",
        }[o.kind]
        out.append({"apiVersion": api, "kind": o.kind, **o.body})
    return out


class As:
    """Requests to the apiserver as a person (``Impersonate-User``/``-Group``) or as the
    admin (``user`` None)."""

    def __init__(self, info: ClusterInfo, user: str | None, *groups: str) -> None:
        self.http = httpx.Client(
            base_url=info.apiserver_url,
            verify=ssl.create_default_context(cafile=str(info.ca_file)),
            headers={"Authorization": f"Bearer {info.token}"},
            timeout=30,
        )
        self.headers: list[tuple[str, str]] = []
        if user is not None:
            self.headers.append(("Impersonate-User", user))
            for g in ("system:authenticated", *groups):
                self.headers.append(("Impersonate-Group", g))

    def status(self, method: str, path: str, body: Any = None, patch: bool = False) -> int:
        headers = list(self.headers)
        if patch:
            headers.append(("Content-Type", "application/merge-patch+json"))
        return self.http.request(method, path, json=body, headers=headers).status_code


@pytest.fixture(scope="module")
def applied(local_cluster: ClusterInfo) -> Iterator[ClusterInfo]:
    kubectl, env = str(local_cluster.kubectl), local_cluster.kube_env()
    namespaces = [ns for t in TENANTS for ns in t.namespaces]
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in namespaces
    ]
    docs += [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": ns},
         "stringData": {"token": f"only for {ns}"}}
        for ns in namespaces
    ]  # fmt: skip
    run(kubectl, "apply", "-f", "-", env=env, stdin=yaml.safe_dump_all(docs))
    objs = [o for t in TENANTS for o in _objects(t)]
    run(kubectl, "apply", "--server-side", "-f", "-", env=env, stdin=yaml.safe_dump_all(objs))
    try:
        yield local_cluster
    finally:
        for ns in namespaces:
            subprocess.run(
                [kubectl, "delete", "namespace", ns, "--wait=false"], env=env, capture_output=True
            )


@pytest.fixture(scope="module")
def admin(applied: ClusterInfo) -> As:
    return As(applied, None)


def allowed(admin: As, user: str, groups: list[str], verb: str, resource: str,
            ns: str = "") -> bool:  # fmt: skip
    """The RBAC authorizer's answer (SubjectAccessReview) for a person."""
    res, _, sub = resource.partition("/")
    name, _, group = res.partition(".")
    attrs = {"verb": verb, "group": group, "resource": name, "subresource": sub}
    if ns:
        attrs["namespace"] = ns
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:authenticated", *groups],
                 "resourceAttributes": attrs},
    }  # fmt: skip
    r = admin.http.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=body)
    assert r.status_code == 201, r.text
    return bool(r.json()["status"].get("allowed"))


def test_a_user_reads_its_own_tenants_secrets_and_never_anothers(applied: ClusterInfo) -> None:
    alice, bob = As(applied, "bnd-alice"), As(applied, "bnd-bob")
    for ns in VISION.namespaces:
        assert alice.status("GET", f"/api/v1/namespaces/{ns}/secrets/{SECRET}") == 200
        assert bob.status("GET", f"/api/v1/namespaces/{ns}/secrets/{SECRET}") == 403
        assert bob.status("GET", f"/api/v1/namespaces/{ns}/secrets") == 403
    assert bob.status("GET", f"/api/v1/namespaces/bnd-speech/secrets/{SECRET}") == 200
    assert alice.status("GET", f"/api/v1/namespaces/bnd-speech/secrets/{SECRET}") == 403
    # A member of the tenant's group, named nowhere as a user, is the tenant's too.
    admin_of_vision = As(applied, "bnd-carol", "bnd-vision-admins")
    assert admin_of_vision.status("GET", f"/api/v1/namespaces/bnd-vision/secrets/{SECRET}") == 200
    assert admin_of_vision.status("GET", "/api/v1/namespaces/bnd-speech/secrets") == 403


# (verb, resource, namespace): alice (vision) may in her namespaces, bob (speech) may not.
ACROSS = [
    ("get", "pods/log", "bnd-vision"),
    ("create", "pods/exec", "bnd-vision"),
    ("create", "pods/portforward", "bnd-vision-serve"),
    ("create", "pods", "bnd-vision"),
    ("list", "secrets", "bnd-vision-serve"),
    ("delete", "jobs.batch", "bnd-vision"),
    ("get", "configmaps", "bnd-vision"),
]


@pytest.mark.parametrize(("verb", "resource", "ns"), ACROSS)
def test_pods_logs_exec_and_workloads_stop_at_the_tenants_namespaces(
    admin: As, verb: str, resource: str, ns: str
) -> None:
    assert allowed(admin, "bnd-alice", [], verb, resource, ns)
    assert not allowed(admin, "bnd-bob", [], verb, resource, ns)
    assert not allowed(admin, "bnd-alice", [], verb, resource, "bnd-speech")
    assert not allowed(admin, "bnd-alice", [], verb, resource, "default")


def test_pods_log_is_refused_for_real_across_tenants(applied: ClusterInfo) -> None:
    """Asked of the apiserver itself: refused before it looks for the pod (403, not 404)."""
    bob = As(applied, "bnd-bob")
    assert bob.status("GET", "/api/v1/namespaces/bnd-vision/pods/any/log") == 403
    assert bob.status("GET", "/api/v1/namespaces/bnd-speech/pods/any/log") == 404


def test_a_user_cannot_raise_its_quota_grant_access_or_change_a_tenant(
    applied: ClusterInfo, admin: As
) -> None:
    alice = As(applied, "bnd-alice")
    quota = f"/api/v1/namespaces/bnd-vision/resourcequotas/gpufleet-tenant-{VISION.name}"
    assert alice.status("GET", quota) == 200  # she may see her limit
    raise_it = {"spec": {"hard": {tenancy.QUOTA_KEY: "1000"}}}
    assert alice.status("PATCH", quota, raise_it, patch=True) == 403
    assert alice.status("DELETE", quota) == 403
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "let-bob-in", "namespace": "bnd-vision"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "edit"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io",
                      "name": "bnd-bob"}],
    }  # fmt: skip
    path = "/apis/rbac.authorization.k8s.io/v1/namespaces/bnd-vision/rolebindings"
    assert alice.status("POST", path, binding) == 403
    for verb in ("create", "update", "patch", "delete"):
        assert not allowed(admin, "bnd-alice", [], verb, "tenants.gpufleet.io")
        assert not allowed(admin, "bnd-alice", [], verb, "namespaces")
    assert not allowed(admin, "bnd-alice", [], "update", "tenants.gpufleet.io/status")
    # What a tenant may do to its own ingress: write NetworkPolicies in its namespaces
    # (only ever opening them further), never in another's.
    assert allowed(admin, "bnd-alice", [], "create", "networkpolicies.networking.k8s.io",
                   "bnd-vision")  # fmt: skip
    assert not allowed(admin, "bnd-alice", [], "delete", "networkpolicies.networking.k8s.io",
                       "bnd-speech")  # fmt: skip


def test_the_network_policy_admits_only_the_tenants_own_namespaces(applied: ClusterInfo) -> None:
    kubectl, env = str(applied.kubectl), applied.kube_env()
    name = f"gpufleet-tenant-{VISION.name}"
    got = yaml.safe_load(
        run(kubectl, "get", "networkpolicy", name, "-n", "bnd-vision-serve", "-o", "yaml", env=env)
    )
    assert got["spec"]["policyTypes"] == ["Ingress"] and got["spec"]["podSelector"] == {}
    (rule,) = got["spec"]["ingress"]
    (peer,) = rule["from"]
    (expr,) = peer["namespaceSelector"]["matchExpressions"]
    assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "In"
    assert expr["values"] == ["bnd-vision", "bnd-vision-serve"]
