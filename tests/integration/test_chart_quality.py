"""The Helm chart as Kubernetes users expect it: values refused by its schema, two releases
side by side, probes and securityContexts on every workload, secrets by reference,
peering shipped, metrics Services, NetworkPolicies and `helm test`.

Rendering needs only helm (scripts/build-helm.sh); the dry runs use the session's real
apiserver (strict field validation), as in test_slurm_chart.py.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_slurm_chart import CHART, helm_binary, run

from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NS = "gpufleet-chartq"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
# The namespaces the dry runs need (a dry run cannot create one that later objects use).
MADE = (NS, f"{NS}-bmc", f"{NS}-evidence")
# Containers that serve no port of their own: the SlurmCluster operator (beside the
# syncer, whose probes stand for the pod).
UNPROBED = {"operator"}
# Containers that run privileged, and why (values.yaml says the same).
PRIVILEGED = {"agent", "slurmd"}
# Containers whose root filesystem stays writable: sshd (host keys, users' files) and
# slurmd (job steps run in its container and write where their user may).
WRITABLE_ROOT = {"sshd", "slurmd"}


def helm() -> str:
    path = helm_binary()
    assert path is not None, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    return path


@functools.cache
def _template(release: str, *extra: str) -> str:
    return run(
        helm(), "template", release, str(CHART), "--namespace", NS,
        "--set", f"bmcSecretsNamespace={NS}-bmc",
        "--set", f"controller.tickets.evidenceNamespace={NS}-evidence", *extra,
    )  # fmt: skip


def render(release: str = "gpufleet", *extra: str) -> list[dict[str, Any]]:
    """The chart's objects (helm runs once per distinct arguments; each call parses anew)."""
    return [d for d in yaml.safe_load_all(_template(release, *extra)) if d]


def render_fails(*extra: str) -> str:
    r = subprocess.run(
        [helm(), "template", "gpufleet", str(CHART), "-n", NS, *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0, f"{extra} rendered"
    return r.stderr


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def key(d: dict[str, Any]) -> tuple[str, str, str]:
    return d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]


# -- values.schema.json -------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("agent.backend=foo", "at '/agent/backend': value must be one of 'real', 'simulated'"),
        ("controller.replicas=two", "at '/controller/replicas': got string, want integer"),
        ("controller.replicas=0", "at '/controller/replicas': minimum: got 0, want 1"),
        ("slurm.restd.replicas=1.5", "at '/slurm/restd/replicas'"),
        ("slurm.restd.port=70000", "at '/slurm/restd/port': maximum"),
        ("slurm.accounting.storagePort=0", "at '/slurm/accounting/storagePort': minimum"),
        ("slurm.login.serviceType=Public", "at '/slurm/login/serviceType': value must be one of"),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy': value must be one of"),
        ("controler.replicas=2", "additional properties 'controler' not allowed"),
        ("slurm.controller.persistence.size=lots", "at '/slurm/controller/persistence/size'"),
        ("controller.resources.limits.memory=1 GB", "at '/controller/resources/limits/memory'"),
        ("networkPolicy.nodeCIDRs={10.0.0.1}", "at '/networkPolicy/nodeCIDRs/0'"),
        ("fullnameOverride=Bad_Name", "at '/fullnameOverride'"),
    ],
)
def test_schema_refuses_bad_values_with_a_clear_message(setting: str, message: str) -> None:
    err = render_fails("--set", setting)
    assert "values don't meet the specifications of the schema" in err, err
    assert message in err, err


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ({"gpus": "eight"}, "at '/slurm/nodePools/0/gpus': got string, want integer"),
        ({"gpuz": 8}, "additional properties 'gpuz' not allowed"),
        ({"gpuType": "h100\nPrologSlurmctld=/x"}, "at '/slurm/nodePools/0/gpuType'"),
    ],
)
def test_schema_holds_node_pools_to_the_slurmcluster_crd(
    tmp_path: Path, pool: dict[str, Any], message: str
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"slurm": {"nodePools": [{"name": "gpu", **pool}]}}))
    err = render_fails("-f", str(values))
    assert message in err, err


def test_schema_accepts_every_documented_option() -> None:
    docs = render(
        "gpufleet",
        *("--set", "agent.backend=simulated", "--set", "controller.replicas=3"),
        *("--set", "syncer.preemptPriority=null", "--set", "slurm.login.serviceType=NodePort"),
    )
    ds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}
    assert "--backend=simulated" in containers(ds["gpufleet-agent"])[0]["args"]


# -- names ----------------------------------------------------------------------------


def test_two_releases_in_one_namespace_share_no_object_name(
    namespaces: tuple[str, dict[str, str]],
) -> None:
    first = render("alpha", "--include-crds")
    # The second release shares the first one's BMC and evidence namespaces (only one
    # release may own a Namespace object).
    second = render(
        "beta", "--include-crds",
        "--set", "createBmcSecretsNamespace=false",
        "--set", "controller.tickets.createEvidenceNamespace=false",
    )  # fmt: skip
    crds = [d for d in first if d["kind"] == "CustomResourceDefinition"]
    objs = [d for d in [*first, *second] if d["kind"] != "CustomResourceDefinition"]
    keys = [key(d) for d in objs]
    assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
    # Every name carries its release (the Namespaces shared on purpose aside).
    for d in second:
        if d["kind"] not in ("CustomResourceDefinition", "SlurmCluster"):
            assert d["metadata"]["name"].startswith("beta-gpufleet"), key(d)
    kubectl, env = namespaces
    run(kubectl, "apply", "--server-side", "--force-conflicts", "-f", "-",
        env=env, stdin=yaml.safe_dump_all(crds))  # fmt: skip
    run(kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s", env=env)
    out = run(
        kubectl, "apply", "--dry-run=server", "--validate=strict", "-f", "-",
        env=env, stdin=yaml.safe_dump_all(objs),
    )  # fmt: skip
    assert out.count("(server dry run)") == len(objs), out


def test_name_overrides() -> None:
    full = {key(d)[2] for d in render("r1", "--set", "fullnameOverride=fleet")}
    assert "fleet-controller" in full and "fleet-slurm-controller" in full
    named = {key(d)[2] for d in render("r1", "--set", "nameOverride=gf")}
    assert "r1-gf-controller" in named and "r1-gf-slurmd" in named
    # A release named after the chart is not repeated: "gpufleet-controller".
    plain = {key(d)[2] for d in render("gpufleet")}
    assert "gpufleet-controller" in plain


# -- workloads ------------------------------------------------------------------------


def workloads(*extra: str) -> list[dict[str, Any]]:
    docs = render("gpufleet", "--set", "slurm.accounting.enabled=true", *extra)
    found = [d for d in docs if d["kind"] in WORKLOADS]
    assert len(found) == 8, [key(d) for d in found]
    return found


def test_every_container_has_readiness_and_liveness_probes() -> None:
    for w in workloads():
        for c in containers(w):
            # A one-shot init container (not a sidecar) runs to completion: Kubernetes
            # refuses probes on it.
            one_shot = c in w["spec"]["template"]["spec"].get("initContainers", []) and (
                c.get("restartPolicy") != "Always"
            )
            if c["name"] in UNPROBED or one_shot:
                continue
            assert "readinessProbe" in c and "livenessProbe" in c, (key(w), c["name"])
    # A start slowed by a loaded node (a Python import, slurmctld reading its state) is
    # judged by a startup probe with minutes to pass, never killed by a liveness probe's
    # guessed initial delay.
    for w in workloads():
        for c in containers(w):
            if "livenessProbe" in c:
                assert "startupProbe" in c, (key(w), c["name"])
                assert "initialDelaySeconds" not in c["livenessProbe"], (key(w), c["name"])
    # The gpufleet processes are probed on their own /metrics port.
    for w in workloads():
        for c in containers(w):
            if c["name"] in ("controller", "agent", "syncer"):
                probe = c["readinessProbe"]["httpGet"]
                assert probe == {"path": "/metrics", "port": "metrics"}, key(w)


def test_security_contexts_hold_least_privilege() -> None:
    for w in workloads():
        pod = w["spec"]["template"]["spec"]
        for c in containers(w):
            sc = c.get("securityContext") or {}
            if c["name"] in PRIVILEGED:
                assert sc.get("privileged") is True, (key(w), c["name"])
                continue
            assert sc.get("privileged") is not True, (key(w), c["name"])
            assert sc.get("allowPrivilegeEscalation") is False, (key(w), c["name"])
            assert "ALL" in sc["capabilities"]["drop"], (key(w), c["name"])
            if c["name"] not in WRITABLE_ROOT:
                assert sc.get("readOnlyRootFilesystem") is True, (key(w), c["name"])
            seccomp = (pod.get("securityContext") or {}).get("seccompProfile")
            assert seccomp == {"type": "RuntimeDefault"}, key(w)
    by_name = {w["metadata"]["name"]: w for w in workloads()}
    for name in ("gpufleet-controller", "gpufleet-slurm-syncer", "gpufleet-slurm-rest"):
        w = by_name[name]
        pod_sc = w["spec"]["template"]["spec"].get("securityContext") or {}
        for c in containers(w):
            non_root = {**pod_sc, **(c.get("securityContext") or {})}.get("runAsNonRoot")
            assert non_root is True, (name, c["name"])


def test_slurm_pods_mount_no_token_and_slurmd_has_a_memory_limit() -> None:
    by_name = {w["metadata"]["name"]: w for w in workloads()}
    for name, w in by_name.items():
        spec = w["spec"]["template"]["spec"]
        if "slurm-syncer" in name or "slurm" not in name:
            continue
        assert spec["automountServiceAccountToken"] is False, name
    slurmd = next(c for c in containers(by_name["gpufleet-slurmd"]) if c["name"] == "slurmd")
    assert slurmd["resources"]["limits"]["memory"]
    for w in by_name.values():
        for c in containers(w):
            assert c["resources"]["limits"].get("memory"), (key(w), c["name"])


def test_placement_values_reach_every_pod() -> None:
    extra = ["--set", "imagePullSecrets[0].name=regcred"]
    paths = {
        "gpufleet-controller": "controller",
        "gpufleet-slurm-syncer": "syncer",
        "gpufleet-slurm-controller": "slurm.controller",
        "gpufleet-slurm-login": "slurm.login",
        "gpufleet-slurm-rest": "slurm.restd",
        "gpufleet-slurm-accounting": "slurm.accounting",
        "gpufleet-slurmd": "slurm.slurmd",
        "gpufleet-agent": "agent",
    }
    for path in paths.values():
        extra += [
            *("--set", f"{path}.nodeSelector.zone=z1"),
            *("--set", f"{path}.priorityClassName=pc-{path.replace('.', '-')}"),
            *("--set", f"{path}.affinity.nodeAffinity.x=y"),
        ]
        if path != "agent":
            extra += ["--set", f"{path}.tolerations[0].key=t-{path.replace('.', '-')}"]
    for w in workloads(*extra):
        spec = w["spec"]["template"]["spec"]
        path = paths[w["metadata"]["name"]]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}], key(w)
        assert spec["nodeSelector"]["zone"] == "z1", key(w)
        assert spec["priorityClassName"] == f"pc-{path.replace('.', '-')}", key(w)
        assert spec["affinity"] == {"nodeAffinity": {"x": "y"}}, key(w)
        if path != "agent":
            assert {"key": f"t-{path.replace('.', '-')}"} in spec["tolerations"], key(w)
    # slurmd keeps its own Node selector and gpufleet's taints beside the added ones.
    slurmd = next(w for w in workloads(*extra) if w["metadata"]["name"] == "gpufleet-slurmd")
    spec = slurmd["spec"]["template"]["spec"]
    assert spec["nodeSelector"]["gpufleet.io/slurm-cluster"] == f"{NS}.gpufleet"
    assert {"key": "gpufleet.io/unhealthy", "operator": "Exists"} in spec["tolerations"]
    # A tenant's dedicated node is tainted NoSchedule for others' pods, not for slurmd.
    assert {"key": "gpufleet.io/tenant", "operator": "Exists"} in spec["tolerations"]


# -- one acting replica ------------------------------------------------------------------


def test_controller_replicas_share_a_lease_and_no_peering_is_shipped() -> None:
    """One acting replica (decision 0141): the replicas hold the Lease <release>-controller in
    the release's namespace (their RBAC names it), sign records with the key Secret
    <release>-record-key, and kopf's peering is gone."""
    docs = render("alpha", "--include-crds")
    assert not [d for d in docs if d["kind"] == "ClusterKopfPeering"]
    assert not [d for d in docs if "kopf.dev" in d["metadata"]["name"]]
    ctl = next(
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-controller")
    )
    container = containers(ctl)[0]
    args = container["args"]
    assert "--peering" not in args
    assert args[args.index("--lease") + 1] == "alpha-gpufleet-controller"
    assert args[args.index("--key-secret") + 1] == "alpha-gpufleet-record-key"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert ctl["spec"]["replicas"] == 2
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("lease"))
    named = {n for r in role["rules"] for n in r.get("resourceNames", [])}
    assert named == {"alpha-gpufleet-controller", "alpha-gpufleet-record-key"}
    vap = next(
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] == "alpha-gpufleet-controller-records"
    )
    assert "gpufleet.io/record" in vap["spec"]["variables"][0]["expression"]


# -- secrets ----------------------------------------------------------------------------


def _volume_secrets(docs: list[dict[str, Any]]) -> set[str]:
    return {
        v["secret"]["secretName"]
        for w in docs
        if w["kind"] in WORKLOADS
        for v in w["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in v
    }


def _controller_args(docs: list[dict[str, Any]]) -> list[str]:
    (ctl,) = [
        d for d in docs if d["kind"] == "Deployment" and "controller" in d["metadata"]["name"]
    ]
    return next(c for c in containers(ctl) if c["name"] == "controller")["args"]


def test_munge_and_jwt_keys_by_reference_or_made_once_by_the_controller() -> None:
    made = render("gpufleet")
    assert not [d for d in made if d["kind"] == "Secret"]  # no random data in a render
    assert {"gpufleet-munge-key", "gpufleet-slurm-jwt"} <= _volume_secrets(made)
    args = _controller_args(made)
    wanted = [args[i + 1] for i, a in enumerate(args) if a == "--generate-secret"]
    assert wanted == ["gpufleet-munge-key:munge.key:1024", "gpufleet-slurm-jwt:jwt_hs256.key:64"]
    refd = render(
        "gpufleet",
        "--set",
        "slurm.munge.secretRef=site-munge",
        "--set",
        "slurm.jwt.secretRef=site-jwt",
    )
    assert not [d for d in refd if d["kind"] == "Secret"]
    assert _volume_secrets(refd) == {"site-munge", "site-jwt"}
    assert "--generate-secret" not in _controller_args(refd)
    # Without the controller nothing would create them: named Secrets are required.
    assert "slurm.munge.secretRef" in render_fails("--set", "controller.enabled=false")


def _bmc_rules(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {
        d["metadata"]["name"]: d["rules"]
        for d in docs
        if d["kind"] == "Role" and d["metadata"]["name"].endswith("-bmc-secrets")
    }


def test_bmc_secret_roles_are_held_to_the_named_secrets() -> None:
    docs = render(
        "gpufleet", "--set", "provisioning.enabled=true",
        "--set", "bmcCredentials.secretNames={rack1,rack2}",
        "--set", "bmcCredentials.create[0].name=rack3",
        "--set", "bmcCredentials.create[0].endpoint=https://127.0.0.1:8443",
        "--set", "bmcCredentials.create[0].username=admin",
        "--set", "bmcCredentials.create[0].password=secret",
    )  # fmt: skip
    rules = _bmc_rules(docs)
    assert set(rules) == {"gpufleet-controller-bmc-secrets", "gpufleet-provisioning-bmc-secrets"}
    for r in rules.values():
        assert r == [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "verbs": ["get"],
                "resourceNames": ["rack3", "rack1", "rack2"],
            }
        ]
    created = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "rack3"]
    assert created[0]["metadata"]["namespace"] == f"{NS}-bmc"
    assert created[0]["stringData"] == {
        "endpoint": "https://127.0.0.1:8443",
        "username": "admin",
        "password": "secret",
    }


# -- metrics, policies, tests, notes -------------------------------------------------------


def test_metrics_services_and_service_monitors() -> None:
    docs = render("gpufleet", "--set", "metrics.serviceMonitor.enabled=true")
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    for component, port in (("controller", 29441), ("agent", 29440), ("slurm-syncer", 29442)):
        svc = services[f"gpufleet-{component}-metrics"]
        assert svc["metadata"]["annotations"]["prometheus.io/port"] == str(port)
        assert svc["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics"}]
        # The Service selects the component's pods, and the ServiceMonitor the Service.
        w = next(
            d
            for d in docs
            if d["kind"] in WORKLOADS and d["metadata"]["name"] == f"gpufleet-{component}"
        )
        assert svc["spec"]["selector"] == w["spec"]["selector"]["matchLabels"]
        mon = monitors[f"gpufleet-{component}"]
        labels = svc["metadata"]["labels"]
        assert mon["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert mon["spec"]["endpoints"][0]["port"] == "metrics"
    assert not [d for d in render("gpufleet") if d["kind"] == "ServiceMonitor"]


def _options_with_policies() -> list[str]:
    return [
        *("--set", "networkPolicy.enabled=true", "--set", "networkPolicy.nodeCIDRs={10.0.0.0/16}"),
        *("--set", "slurm.accounting.enabled=true"),
        *("--set", "slurm.controller.persistence.enabled=false"),
    ]


def test_network_policies_cover_every_component() -> None:
    docs = render("gpufleet", *_options_with_policies())
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    selected = {
        tuple(sorted(p["spec"]["podSelector"]["matchLabels"].items())) for p in policies.values()
    }
    for w in (d for d in docs if d["kind"] in WORKLOADS):
        if w["metadata"]["name"] == "gpufleet-slurmd":  # host network: no policy applies
            continue
        assert tuple(sorted(w["spec"]["selector"]["matchLabels"].items())) in selected, key(w)
    rest = policies["gpufleet-slurm-rest"]["spec"]["ingress"][0]
    assert rest["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == (
        "gpufleet-slurm-syncer"
    )
    ctld = policies["gpufleet-slurm-controller"]["spec"]["ingress"][0]["from"]
    assert {"ipBlock": {"cidr": "10.0.0.0/16"}} in ctld
    assert not [d for d in render("gpufleet") if d["kind"] == "NetworkPolicy"]


@pytest.fixture(scope="module")
def namespaces(local_cluster: ClusterInfo) -> Iterator[tuple[str, dict[str, str]]]:
    """kubectl and its env, with MADE created once for the module (a namespace deleted
    between tests would still be terminating when the next one wants it)."""
    kubectl, env = str(local_cluster.kubectl), local_cluster.kube_env()
    for name in MADE:
        subprocess.run([kubectl, "create", "namespace", name], env=env, capture_output=True)
    try:
        yield kubectl, env
    finally:
        for name in MADE:
            subprocess.run(
                [kubectl, "delete", "namespace", name, "--wait=false"], env=env, capture_output=True
            )


def test_policies_emptydir_state_and_bmc_secrets_pass_a_strict_dry_run(
    namespaces: tuple[str, dict[str, str]],
) -> None:
    kubectl, env = namespaces
    docs = render(
        "gpufleet", *_options_with_policies(),
        "--set", "bmcCredentials.create[0].name=rack3",
        "--set", "bmcCredentials.create[0].endpoint=https://127.0.0.1:8443",
        "--set", "bmcCredentials.create[0].username=admin",
        "--set", "bmcCredentials.create[0].password=secret",
    )  # fmt: skip
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert {"name": "state", "emptyDir": {}} in sts["spec"]["template"]["spec"]["volumes"]
    wanted = {"NetworkPolicy", "StatefulSet", "Secret", "Role", "Pod", "Service"}
    objs = [d for d in docs if d["kind"] in wanted and d["metadata"]["namespace"] in MADE]
    out = run(
        kubectl, "apply", "--dry-run=server", "--validate=strict", "-f", "-",
        env=env, stdin=yaml.safe_dump_all(objs),
    )  # fmt: skip
    assert out.count("(server dry run)") == len(objs), out


def test_helm_test_pod_reads_each_metrics_service() -> None:
    docs = render("gpufleet")
    pods = [d for d in docs if d["kind"] == "Pod"]
    assert [p["metadata"]["annotations"]["helm.sh/hook"] for p in pods] == ["test"]
    cmd = pods[0]["spec"]["containers"][0]["command"]
    assert cmd[-2:] == [
        "http://gpufleet-controller-metrics:29441/metrics",
        "http://gpufleet-slurm-syncer-metrics:29442/metrics",
    ]
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert {"gpufleet-controller-metrics", "gpufleet-slurm-syncer-metrics"} <= services
    assert not [d for d in render("gpufleet", "--set", "tests.enabled=false") if d["kind"] == "Pod"]


def test_notes_name_the_release_and_warn_of_a_missing_storage_class(
    local_cluster: ClusterInfo,
) -> None:
    # helm asks the apiserver its version even for a client-side dry run.
    out = run(
        helm(), "install", "gpufleet", str(CHART), "-n", "gpufleet-notes", "--dry-run=client",
        # Namespaces that never exist: helm would refuse to take over an existing one.
        "--set", "bmcSecretsNamespace=gpufleet-notes-bmc",
        "--set", "controller.tickets.evidenceNamespace=gpufleet-notes-evidence",
        env=local_cluster.kube_env(),
    )  # fmt: skip
    notes = out.split("NOTES:", 1)[1]
    assert "Deployment gpufleet-controller (2 replicas, one acting" in notes
    assert "stays\nPending" in notes or "stays Pending" in notes
    assert "docs/install.md" in notes


# -- what the chart hands the operator ------------------------------------------------------


@pytest.mark.parametrize("accounting", [False, True])
def test_chart_slurmcluster_renders_typed_gres_and_gpu_tres(accounting: bool) -> None:
    """The chart's SlurmCluster, through the operator's own renderer (slurm.conf is rendered
    there, in Python, not by the chart): typed gres from nodePools[].gpuType, and GPU use
    accounted (AccountingStorageTRES=gres/gpu) once slurmdbd is on."""
    from gpufleet.api.slurmcluster import SlurmClusterSpec
    from gpufleet.slurm import render as slurm_render

    docs = render("gpufleet", "--set", f"slurm.accounting.enabled={str(accounting).lower()}")
    cluster = next(d for d in docs if d["kind"] == "SlurmCluster")
    spec = SlurmClusterSpec.model_validate(cluster["spec"])
    nodes = [
        slurm_render.NodeInfo(name=f"gpu-node-{i}", labels={"nvidia.com/gpu.present": "true"})
        for i in range(2)
    ]
    pools = slurm_render.assign(spec, nodes)
    conf = slurm_render.render_slurm_conf(spec, pools)
    assert "GresTypes=gpu" in conf.splitlines()
    assert conf.count("Gres=gpu:h100:8") == 2
    assert "Type=h100" in slurm_render.render_gres_conf(spec, pools)
    # slurmctld's pod name, and where the others reach it: its DNS name under the headless
    # Service (the bare pod name does not resolve).
    ctld = f"{cluster['metadata']['name']}-slurm-controller"
    assert f"SlurmctldHost={ctld}-0({ctld}-0.{ctld})" in conf.splitlines()
    assert ("AccountingStorageTRES=gres/gpu" in conf.splitlines()) is accounting
    # Jobs in cgroups, confined to the GPUs they were given.
    assert "ProctrackType=proctrack/cgroup" in conf.splitlines()
    assert "TaskPlugin=task/cgroup,task/affinity" in conf.splitlines()
    cgroup = slurm_render.render_all(spec, nodes)["cgroup.conf"].splitlines()
    assert {"CgroupPlugin=cgroup/v2", "ConstrainDevices=yes", "IgnoreSystemd=yes"} <= set(cgroup)
    if accounting:
        assert "AccountingStorageHost=gpufleet-slurm-accounting" in conf.splitlines()


def test_chart_slurmdbd_writes_the_conf_slurmdbd_reads() -> None:
    """The chart's slurmdbd writes slurmdbd.conf in a shell heredoc (its database password
    comes from a Secret at start). It says what the domain's slurmdbd.conf says (which
    the local cluster runs against real slurmdbd and MariaDB), where slurmdbd looks for
    it: slurmdbd has no option naming its file and refuses a DbdHost not its own."""
    from gpufleet.domain import slurm_accounting

    docs = render("gpufleet", "--set", "slurm.accounting.enabled=true")
    dbd = next(d for d in docs if d["metadata"]["name"] == "gpufleet-slurm-accounting"
               and d["kind"] == "Deployment")  # fmt: skip
    container = dbd["spec"]["template"]["spec"]["containers"][0]
    script = container["command"][-1]
    assert script.rstrip().splitlines()[-1].split() == ["exec", "slurmdbd", "-D"]
    heredoc = script.split("<<CONF\n", 1)[1].split("\nCONF", 1)[0]
    written = dict(line.split("=", 1) for line in heredoc.splitlines())
    conf_dir = "/run/slurmdbd"
    assert script.count(f"cat > {conf_dir}/slurmdbd.conf") == 1
    env = {e["name"]: e for e in container["env"]}
    assert env["SLURM_CONF"]["value"].rsplit("/", 1)[0] == conf_dir
    assert written["DbdHost"] == "$(cat /proc/sys/kernel/hostname)"
    assert written["StoragePass"] == "$DB_PASSWORD" and "DB_PASSWORD" in env
    reference = slurm_accounting.slurmdbd_conf(
        slurm_accounting.DbdConfig(
            dbd_host="h", storage_host="mariadb", storage_user="slurm",
            storage_password="p", pid_file=f"{conf_dir}/slurmdbd.pid",
        )
    )  # fmt: skip
    expected = dict(line.split("=", 1) for line in reference.splitlines()[1:])
    assert written.keys() == expected.keys()
    same = ("AuthType", "DbdPort", "SlurmUser", "PidFile", "StorageType", "StorageUser",
            "StorageLoc", "StorageHost", "PrivateData")  # fmt: skip
    assert {k: written[k] for k in same} == {k: expected[k] for k in same}


# -- BMC Secrets: resourceNames enforced by the real authorizer ------------------------------


def test_bmc_roles_let_the_controller_read_only_the_named_secrets(
    namespaces: tuple[str, dict[str, str]],
) -> None:
    kubectl, env = namespaces
    docs = render(
        "gpufleet", "--set", "provisioning.enabled=true",
        "--set", "bmcCredentials.secretNames={rack1}",
    )  # fmt: skip
    rbac = [
        d
        for d in docs
        if d["kind"] in ("ServiceAccount", "Role", "RoleBinding")
        and d["metadata"]["namespace"] in (NS, f"{NS}-bmc")
    ]
    run(kubectl, "apply", "-f", "-", env=env, stdin=yaml.safe_dump_all(rbac))

    def can_get(account: str, secret: str) -> bool:
        r = subprocess.run(
            [kubectl, "auth", "can-i", "get", f"secrets/{secret}", "-n", f"{NS}-bmc",
             "--as", f"system:serviceaccount:{NS}:gpufleet-{account}"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.stdout.strip() in ("yes", "no"), r.stdout + r.stderr
        return r.stdout.strip() == "yes"

    for account in ("controller", "provisioning"):
        assert can_get(account, "rack1"), account
        assert not can_get(account, "gpufleet-munge-key"), account
        assert not can_get(account, "rack2"), account
