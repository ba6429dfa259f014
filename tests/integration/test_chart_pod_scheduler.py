"""The chart's pod scheduler (podScheduler.*, docs/pod-scheduler.md): off by default, and when
on a Deployment of `gpufleet pod-scheduler` with leader election, Slurm reached through a
munged sidecar and the release's slurm.conf, and RBAC for exactly what it does to Pods.

Rendered by helm (scripts/build-helm.sh); the objects pass a strict server-side dry run on the
session's real apiserver, as in test_slurm_chart.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from chart_workloads import assert_hardened, container, objects_of, unknown_flags
from chart_workloads import flags as flag_values
from test_chart_quality import render, render_fails
from test_slurm_chart import CHART, helm_binary, run

from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

ON = ("--set", "podScheduler.enabled=true")
NAME = "gpufleet-pod-scheduler"


def _objects(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return objects_of(docs, "pod-scheduler")


def _deployment(*extra: str) -> dict[str, Any]:
    return _objects(render("gpufleet", *ON, *extra))[("Deployment", NAME)]


_container = container


def test_off_by_default_and_refused_without_slurm() -> None:
    assert not _objects(render("gpufleet"))
    made = set(_objects(render("gpufleet", *ON)))
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
    assert "needs slurm.enabled" in render_fails(*ON, "--set", "slurm.enabled=false")
    assert "podScheduler" in render_fails(*ON, "--set", "podScheduler.interval=0")


def test_rbac_is_exactly_what_the_scheduler_does() -> None:
    objs = _objects(render("alpha", *ON))
    name = "alpha-gpufleet-pod-scheduler"
    granted = {
        (group, resource, verb)
        for rule in objs[("ClusterRole", name)]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    read = ("get", "list", "watch")
    assert granted == {
        *(("", "pods", v) for v in (*read, "patch")),
        ("", "pods/binding", "create"),
        ("", "pods/eviction", "create"),
        ("", "pods/status", "patch"),
        ("", "events", "create"),
        ("", "events", "patch"),
        *(("", "nodes", v) for v in read),
        *(("", "namespaces", v) for v in read),
        *(("batch", "jobs", v) for v in read),
    }
    # Its Lease only, in the release's namespace; no Secret, no Node write.
    role = objs[("Role", f"{name}-lease")]
    assert role["metadata"]["namespace"] == "gpufleet-chartq"
    assert {r["resources"][0] for r in role["rules"]} == {"leases"}
    named = {n for r in role["rules"] for n in r.get("resourceNames", [])}
    assert named == {name}
    for binding in (objs[("ClusterRoleBinding", name)], objs[("RoleBinding", f"{name}-lease")]):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": name, "namespace": "gpufleet-chartq"}
        ]


def test_the_deployment_runs_the_command_with_its_own_flags_and_a_lease() -> None:
    d = _deployment()
    assert d["spec"]["replicas"] == 2
    c = _container(d, "pod-scheduler")
    args = c["args"]
    assert args[0] == "pod-scheduler"
    flags = flag_values(args)
    assert flags["--lease-name"] == NAME
    assert flags["--lease-namespace"] == "gpufleet-chartq"
    assert "--leader-election" in flags and "--dry-run" not in flags
    assert flags["--slurm-conf"] == "/etc/slurm/slurm.conf"
    # /metrics for the kubelet's probes and Prometheus, so on the pod's address.
    assert (flags["--metrics-port"], flags["--metrics-address"]) == ("29443", "0.0.0.0")
    # Every flag the chart passes is one `gpufleet pod-scheduler` takes.
    assert not unknown_flags("pod-scheduler", set(flags))
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    dry = _container(
        _deployment("--set", "podScheduler.dryRun=true", "--set", "podScheduler.replicas=1"),
        "pod-scheduler",
    )
    assert "--dry-run" in dry["args"]
    assert "--interval=2" in c["args"]


def test_slurm_is_reached_with_the_release_config_and_munge_key() -> None:
    d = _deployment("--set", "slurm.munge.secretRef=sealed-munge")
    spec = d["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["munge-key"]["secret"]["secretName"] == "sealed-munge"
    assert volumes["slurm-config"]["configMap"]["name"] == "gpufleet-slurm-config"
    # No JWT key: it never talks to slurmrestd.
    assert not [v for v in volumes.values() if "jwt" in str(v.get("secret", ""))]
    munged = _container(d, "munged")
    assert munged["restartPolicy"] == "Always"  # a native sidecar, started first
    mounts = {m["name"]: m["mountPath"] for m in _container(d, "pod-scheduler")["volumeMounts"]}
    assert mounts["munge-run"] == "/run/munge" and mounts["slurm-config"] == "/etc/slurm"
    assert "munge-key" not in mounts  # only the sidecar holds the key


def test_probes_security_and_placement_as_every_gpufleet_workload() -> None:
    d = _deployment(
        *("--set", "podScheduler.nodeSelector.zone=z1"),
        *("--set", "podScheduler.tolerations[0].key=t1"),
        *("--set", "podScheduler.priorityClassName=pc1"),
        *("--set", "imagePullSecrets[0].name=regcred"),
    )
    spec = d["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"zone": "z1"}
    assert spec["tolerations"] == [{"key": "t1"}]
    assert spec["priorityClassName"] == "pc1"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert_hardened(_container(d, "pod-scheduler"), 29443)


def test_metrics_service_policy_monitor_and_budget() -> None:
    docs = render(
        "gpufleet",
        *ON,
        *("--set", "networkPolicy.enabled=true", "--set", "metrics.serviceMonitor.enabled=true"),
    )
    objs = _objects(docs)
    d = objs[("Deployment", NAME)]
    selector = d["spec"]["selector"]["matchLabels"]
    assert objs[("Service", f"{NAME}-metrics")]["spec"]["selector"] == selector
    assert objs[("ServiceMonitor", NAME)]["spec"]["selector"]["matchLabels"].items() <= (
        objs[("Service", f"{NAME}-metrics")]["metadata"]["labels"].items()
    )
    policy = objs[("NetworkPolicy", NAME)]["spec"]
    assert policy["podSelector"]["matchLabels"] == selector
    assert policy["ingress"][0]["ports"] == [{"port": 29443, "protocol": "TCP"}]
    assert objs[("PodDisruptionBudget", NAME)]["spec"]["maxUnavailable"] == 1
    helm_test = next(d for d in docs if d["metadata"]["name"] == "gpufleet-test-metrics")
    urls = helm_test["spec"]["containers"][0]["command"]
    assert f"http://{NAME}-metrics:29443/metrics" in urls
    # One replica: a budget of one would hold every drain of its node; none is made.
    single = _objects(render("gpufleet", *ON, "--set", "podScheduler.replicas=1"))
    assert ("PodDisruptionBudget", NAME) not in single


def test_the_objects_pass_a_strict_server_side_dry_run(local_cluster: ClusterInfo) -> None:
    helm = helm_binary()
    assert helm is not None, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    text = run(
        helm, "template", "gpufleet", str(CHART), "--namespace", "default", *ON,
        "--set", "networkPolicy.enabled=true",
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(text) if d and "pod-scheduler" in d["metadata"]["name"]]
    assert {d["kind"] for d in docs} >= {"Deployment", "ClusterRole", "NetworkPolicy"}
    out = run(
        str(local_cluster.kubectl), "apply", "--dry-run=server", "--validate=strict", "-f", "-",
        env=local_cluster.kube_env(), stdin=yaml.safe_dump_all(docs),
    )  # fmt: skip
    assert out.count("(server dry run)") == len(docs), out
