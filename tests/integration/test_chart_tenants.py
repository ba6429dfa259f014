"""The chart's tenants (tenants, tenantController.*; docs/tenants.md): the tenant controller is
off by default, and when on a Deployment of `gpufleet tenant-controller` with leader election,
Slurm reached through a munged sidecar and the release's slurm.conf, and RBAC for exactly the
objects it writes; each entry of `tenants` becomes a Tenant object kept on uninstall.

Rendered by helm (scripts/build-helm.sh); the objects pass a strict server-side dry run on the
session's real apiserver with the chart's Tenant CRD installed, as in test_slurm_chart.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_workloads import assert_hardened, container, flags, granted, objects_of, unknown_flags
from test_chart_quality import render, render_fails
from test_slurm_chart import CHART, helm_binary, run

from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

ON = ("--set", "tenantController.enabled=true")
NAME = "gpufleet-tenant-controller"
NS = "gpufleet-chartq"
TENANTS = """\
tenantController: {enabled: true}
tenants:
  - name: chart-vision
    displayName: Vision team
    namespaces: [chart-vision]
    users: [{name: alice, uid: 20001, gid: 20001, sshKeys: ["ssh-ed25519 AAAAC3Nz alice"]}]
    slurm: {account: vision, partitions: [batch]}
    gpuQuota: 16
  - name: chart-speech
    namespaces: [chart-speech]
"""


def _values(tmp: Path) -> tuple[str, str]:
    path = tmp / "tenants.yaml"
    path.write_text(TENANTS)
    return "-f", str(path)


def _deployment(*extra: str) -> dict[str, Any]:
    return objects_of(render("gpufleet", *ON, *extra), "tenant")[("Deployment", NAME)]


def test_off_by_default_and_tenants_need_the_controller() -> None:
    assert not objects_of(render("gpufleet"), "tenant")
    made = set(objects_of(render("gpufleet", *ON), "tenant"))
    assert made == {
        ("ServiceAccount", NAME),
        ("ClusterRole", NAME),
        ("ClusterRoleBinding", NAME),
        ("Role", f"{NAME}-lease"),
        ("RoleBinding", f"{NAME}-lease"),
        ("Deployment", NAME),
        ("Service", f"{NAME}-metrics"),
        ("PodDisruptionBudget", NAME),
    }
    # Tenants nobody reconciles would hold no quota: refused, with the reason.
    assert "tenants needs tenantController.enabled" in render_fails(
        "--set", "tenants[0].name=vision"
    )
    assert "tenants" in render_fails(*ON, "--set", "tenants[0].name=Not_A_Name")
    assert "tenantController" in render_fails(*ON, "--set", "tenantController.interval=0")


def test_each_tenant_entry_is_a_tenant_object_kept_on_uninstall(tmp_path: Path) -> None:
    tenants = {
        d["metadata"]["name"]: d
        for d in render("gpufleet", *_values(tmp_path))
        if d["kind"] == "Tenant"
    }
    assert set(tenants) == {"chart-vision", "chart-speech"}
    vision = tenants["chart-vision"]
    assert vision["apiVersion"] == "gpufleet.io/v1alpha1"
    assert "namespace" not in vision["metadata"]  # cluster-scoped: it owns namespaces
    # The entry without its name is the spec, as written.
    assert vision["spec"] == {
        "displayName": "Vision team",
        "namespaces": ["chart-vision"],
        "users": [
            {"name": "alice", "uid": 20001, "gid": 20001, "sshKeys": ["ssh-ed25519 AAAAC3Nz alice"]}
        ],
        "slurm": {"account": "vision", "partitions": ["batch"]},
        "gpuQuota": 16,
    }
    assert tenants["chart-speech"]["spec"] == {"namespaces": ["chart-speech"]}
    # helm uninstall must not delete them: deletion waits for the tenant's work to end,
    # which needs the controller the uninstall removes.
    for t in tenants.values():
        assert t["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_rbac_is_exactly_what_the_tenant_controller_writes() -> None:
    objs = objects_of(render("alpha", *ON), "tenant")
    name = "alpha-gpufleet-tenant-controller"
    rules = granted(objs[("ClusterRole", name)])
    read = ("get", "list", "watch")
    write = ("create", "patch", "delete")
    assert rules == {
        *(("gpufleet.io", "tenants", v, "") for v in (*read, "patch")),
        ("gpufleet.io", "tenants/status", "patch", ""),
        *(("gpufleet.io", "noderemediations", v, "") for v in read),
        *(("", "resourcequotas", v, "") for v in (*read, *write)),
        *(("rbac.authorization.k8s.io", "rolebindings", v, "") for v in (*read, *write)),
        *(("networking.k8s.io", "networkpolicies", v, "") for v in (*read, *write)),
        *(("", r, v, "") for r in ("pods", "namespaces", "nodes") for v in read),
        ("", "nodes", "patch", ""),  # the label and taint of a tenant's own nodes
        ("", "events", "create", ""),
        ("", "events", "patch", ""),
        ("rbac.authorization.k8s.io", "clusterroles", "bind", "edit"),
    }
    # No namespace is ever created or deleted, no Secret read, no Node created or deleted.
    assert not {g for g in rules if g[1] == "namespaces" and g[2] not in read}
    assert not {g for g in rules if g[1] == "nodes" and g[2] not in (*read, "patch")}
    assert not {g for g in rules if g[1] == "secrets"}
    role = objs[("Role", f"{name}-lease")]
    assert role["metadata"]["namespace"] == NS
    named = {n for r in role["rules"] for n in r.get("resourceNames", [])}
    assert named == {name}
    for binding in (objs[("ClusterRoleBinding", name)], objs[("RoleBinding", f"{name}-lease")]):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": name, "namespace": NS}]
    wider = objects_of(
        render("alpha", *ON, "--set", "tenantController.bindableRoles={edit,view}"), "tenant"
    )
    bind = [r for r in wider[("ClusterRole", name)]["rules"] if r["verbs"] == ["bind"]]
    assert bind[0]["resourceNames"] == ["edit", "view"]


def test_the_deployment_runs_the_command_with_its_own_flags_and_a_lease() -> None:
    d = _deployment()
    assert d["spec"]["replicas"] == 2
    c = container(d, "tenant-controller")
    args = c["args"]
    assert args[0] == "tenant-controller"
    passed = flags(args)
    assert passed["--lease-name"] == NAME
    assert passed["--lease-namespace"] == NS
    assert "--leader-election" in passed and "--dry-run" not in passed
    assert passed["--slurm-conf"] == "/etc/slurm/slurm.conf"
    assert (passed["--metrics-port"], passed["--metrics-address"]) == ("29445", "0.0.0.0")
    assert passed["--interval"] == "10"
    no_slurm = container(_deployment("--set", "slurm.enabled=false"), "tenant-controller")
    # Without Slurm: Kubernetes only (no --slurm-conf).
    assert not [a for a in no_slurm["args"] if a.startswith("--slurm-conf")]
    # Every flag the chart passes is one `gpufleet tenant-controller` takes.
    assert not unknown_flags("tenant-controller", {*passed, "--dry-run"})
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    dry = _deployment("--set", "tenantController.dryRun=true")
    assert "--dry-run" in container(dry, "tenant-controller")["args"]


def test_slurm_through_munge_only_when_slurm_is_on() -> None:
    d = _deployment("--set", "slurm.munge.secretRef=sealed-munge")
    spec = d["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["munge-key"]["secret"]["secretName"] == "sealed-munge"
    assert volumes["slurm-config"]["configMap"]["name"] == "gpufleet-slurm-config"
    assert container(d, "munged")["restartPolicy"] == "Always"
    mounts = {m["name"]: m["mountPath"] for m in container(d, "tenant-controller")["volumeMounts"]}
    assert mounts["munge-run"] == "/run/munge" and mounts["slurm-config"] == "/etc/slurm"
    assert "munge-key" not in mounts  # only the sidecar holds the key
    bare = _deployment("--set", "slurm.enabled=false")["spec"]["template"]["spec"]
    assert "initContainers" not in bare
    assert {v["name"] for v in bare["volumes"]} == {"tmp"}


def test_probes_security_metrics_policy_and_budget() -> None:
    docs = render(
        "gpufleet",
        *ON,
        *("--set", "networkPolicy.enabled=true", "--set", "metrics.serviceMonitor.enabled=true"),
        *("--set", "tenantController.nodeSelector.zone=z1"),
        *("--set", "tenantController.priorityClassName=pc1"),
    )
    objs = objects_of(docs, "tenant")
    d = objs[("Deployment", NAME)]
    spec = d["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"zone": "z1"} and spec["priorityClassName"] == "pc1"
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(d, "tenant-controller")
    assert_hardened(c, 29445)
    selector = d["spec"]["selector"]["matchLabels"]
    service = objs[("Service", f"{NAME}-metrics")]
    assert service["spec"]["selector"] == selector
    monitor = objs[("ServiceMonitor", NAME)]["spec"]["selector"]["matchLabels"]
    assert monitor.items() <= service["metadata"]["labels"].items()
    policy = objs[("NetworkPolicy", NAME)]["spec"]
    assert policy["podSelector"]["matchLabels"] == selector
    assert policy["ingress"][0]["ports"] == [{"port": 29445, "protocol": "TCP"}]
    assert objs[("PodDisruptionBudget", NAME)]["spec"]["maxUnavailable"] == 1
    helm_test = next(d for d in docs if d["metadata"]["name"] == "gpufleet-test-metrics")
    assert f"http://{NAME}-metrics:29445/metrics" in helm_test["spec"]["containers"][0]["command"]
    single = objects_of(render("gpufleet", *ON, "--set", "tenantController.replicas=1"), "tenant")
    assert ("PodDisruptionBudget", NAME) not in single


def test_the_objects_and_tenants_pass_a_strict_server_side_dry_run(
    local_cluster: ClusterInfo, tmp_path: Path
) -> None:
    helm = helm_binary()
    assert helm is not None, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    kubectl, env = str(local_cluster.kubectl), local_cluster.kube_env()
    text = run(
        helm, "template", "gpufleet", str(CHART), "--namespace", "default", "--include-crds",
        *_values(tmp_path), "--set", "networkPolicy.enabled=true",
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(text) if d]
    crd = next(
        d for d in docs
        if d["kind"] == "CustomResourceDefinition" and d["spec"]["names"]["kind"] == "Tenant"
    )  # fmt: skip
    assert crd["spec"]["scope"] == "Cluster"
    # The CRD for real (a dry run cannot create a type later objects use).
    run(kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-",
        env=env, stdin=yaml.safe_dump(crd))  # fmt: skip
    run(kubectl, "wait", "--for=condition=Established", "crd/tenants.gpufleet.io",
        "--timeout=60s", env=env)  # fmt: skip
    ours = [
        d for d in docs
        if d["kind"] == "Tenant" or "tenant-controller" in d["metadata"]["name"]
    ]  # fmt: skip
    assert {d["kind"] for d in ours} >= {"Deployment", "ClusterRole", "NetworkPolicy", "Tenant"}
    out = run(
        kubectl, "apply", "--dry-run=server", "--validate=strict", "-f", "-",
        env=env, stdin=yaml.safe_dump_all(ours),
    )  # fmt: skip
    assert out.count("(server dry run)") == len(ours), out
    # The apiserver refuses a Tenant the CRD's schema does not allow (a quota below 0).
    bad = next(d for d in ours if d["kind"] == "Tenant")
    bad = {**bad, "spec": {**bad["spec"], "gpuQuota": -1}}
    refused = subprocess.run(
        [kubectl, "apply", "--dry-run=server", "-f", "-"],
        input=yaml.safe_dump(bad), env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode != 0 and "gpuQuota" in refused.stderr, refused.stderr
