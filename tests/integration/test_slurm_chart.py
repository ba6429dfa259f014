"""The Helm chart: lint, template, and the rendered manifests accepted by a real apiserver.

helm is built from the Go module proxy into ~/.cache/gpufleet/bin/helm-<version>/
by scripts/build-helm.sh, which the test command runs; without it these tests fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.api.slurmcluster import SlurmClusterSpec
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpufleet"
NS = "gpufleet-chart-test"
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ClusterKopfPeering",
}


def helm_binary() -> str | None:
    cache = Path(os.environ.get("GPUFLEET_CACHE", Path.home() / ".cache" / "gpufleet")) / "bin"
    for found in sorted(cache.glob("helm-*/helm"), reverse=True):
        if os.access(found, os.X_OK):
            return str(found)
    return shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    path = helm_binary()
    assert path is not None, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    return path


def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> str:
    r = subprocess.run(args, capture_output=True, text=True, env=env, input=stdin, timeout=120)
    assert r.returncode == 0, f"{' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.mark.parametrize(
    "extra",
    [
        [],
        [
            *("--set", "slurm.accounting.enabled=true", "--set", "provisioning.enabled=true"),
            *(
                "--set",
                "networkPolicy.enabled=true",
                "--set",
                "metrics.serviceMonitor.enabled=true",
            ),
            *("--set", "slurm.controller.persistence.enabled=false"),
            *("--set", "slurm.munge.secretRef=site-munge", "--set", "slurm.jwt.secretRef=site-jwt"),
            *("--set", "bmcCredentials.secretNames={rack1}"),
        ],
    ],
    ids=["defaults", "options"],
)
def test_helm_lint(helm: str, extra: list[str]) -> None:
    run(helm, "lint", str(CHART), "--strict", *extra)


@pytest.mark.parametrize(
    ("suffix", "extra"),
    [
        ("plain", []),
        (
            "options",
            [
                *("--set", "slurm.accounting.enabled=true"),
                *("--set", "slurm.accounting.enforceLimits=true"),
                *("--set", "agent.jobTelemetryDir=/shared/gpufleet-telemetry"),
                *("--set", "agent.maintenanceCommandsDir=/etc/gpufleet/maintenance.d"),
                *("--set", "controller.tickets.webhook=https://127.0.0.1:8443/tickets"),
                *("--set", "controller.tickets.authSecret=ticket-auth"),
                *("--set", "networkPolicy.enabled=true"),
                *("--set", "bmcCredentials.secretNames={r1}"),
            ],
        ),
    ],
)
def test_rendered_manifests_pass_server_side_dry_run(
    helm: str, local_cluster: ClusterInfo, suffix: str, extra: list[str]
) -> None:
    ns = f"{NS}-{suffix}"
    kubectl = str(local_cluster.kubectl)
    env = local_cluster.kube_env()
    bmc_ns, evidence_ns = f"{ns}-bmc", f"{ns}-evidence"
    rendered = run(
        helm, "template", "gpufleet", str(CHART), "--namespace", ns, "--include-crds",
        "--set", f"bmcSecretsNamespace={bmc_ns}",
        "--set", f"controller.tickets.evidenceNamespace={evidence_ns}", *extra,
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = {d["kind"] for d in docs}
    # No Secret: the Slurm keys are named by secretRef or made once by the controller (0188).
    assert {"StatefulSet", "DaemonSet", "Deployment", "SlurmCluster"} <= kinds
    # The operator must accept what the chart renders (helm once printed 1000000 as 1e+06).
    for cluster in (d for d in docs if d["kind"] == "SlurmCluster"):
        spec = SlurmClusterSpec.model_validate(cluster["spec"])
        assert spec.accounting.enforce_limits is (suffix == "options")
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    # CRDs and the namespace for real (a dry run cannot create a type or a namespace
    # that later objects need); everything else only as a server-side dry run.
    run(
        kubectl,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        env=env,
        stdin=yaml.safe_dump_all(crds),
    )
    run(kubectl, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s", env=env)
    # The chart also writes to the BMC Secrets' namespace and to kube-system (join
    # tokens): every namespaced object names its namespace.
    for d in rest:
        if d["kind"] not in CLUSTER_SCOPED:
            assert d["metadata"].get("namespace"), f"{d['kind']} {d['metadata']['name']}"
    for name in (ns, bmc_ns, evidence_ns):
        subprocess.run([kubectl, "create", "namespace", name], env=env, capture_output=True)
    try:
        out = run(
            kubectl,
            "apply",
            "--dry-run=server",
            "--validate=strict",  # unknown or duplicate fields are errors, not warnings
            "-f",
            "-",
            env=env,
            stdin=yaml.safe_dump_all(rest),
        )
    finally:
        for name in (ns, bmc_ns, evidence_ns):
            subprocess.run(
                [kubectl, "delete", "namespace", name, "--wait=false"], env=env, capture_output=True
            )
    assert out.count("(server dry run)") == len(rest), out
