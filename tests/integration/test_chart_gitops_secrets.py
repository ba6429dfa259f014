"""The chart under GitOps: renders that never differ, and Slurm keys that are never replaced.

Argo CD renders a chart with ``helm template`` (no cluster access); a chart that made its
keys with ``lookup`` and random data handed it a new munge key on every sync. Here: two
renders with every option are the same; an install that names existing Secrets mounts
them and creates none (helm against the session's real apiserver, no pod has to run);
and the controller's create-once keeps a Secret that exists, such as the one the
previous chart made (docs/decisions/0188).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from test_slurm_chart import CHART, helm_binary, run

from gpufleet.kubeapi import SECRETS, KubeApi
from gpufleet.lifecycle.generated_secrets import GeneratedSecret, ensure
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

NS = "gpufleet-gitops"
RELEASE = "gitops"
OPTIONS = (
    *("--set", "slurm.accounting.enabled=true", "--set", "provisioning.enabled=true"),
    *("--set", "networkPolicy.enabled=true", "--set", "metrics.serviceMonitor.enabled=true"),
    *("--set", "controller.tickets.webhook=https://127.0.0.1:8443/t"),
)


def helm() -> str:
    path = helm_binary()
    assert path is not None, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    return path


@pytest.mark.parametrize("extra", [(), OPTIONS], ids=["defaults", "options"])
def test_two_renders_are_the_same(extra: tuple[str, ...]) -> None:
    first, second = (
        run(helm(), "template", "gpufleet", str(CHART), "-n", NS, *extra) for _ in range(2)
    )
    assert first == second


def _kubectl_json(info: ClusterInfo, *args: str) -> Any:
    return json.loads(run(str(info.kubectl), *args, "-o", "json", env=info.kube_env()))


def _site_secret(name: str, key: str, value: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NS},
            "data": {key: base64.b64encode(value.encode()).decode()},
        }
    )


def test_an_install_naming_existing_secrets_mounts_them_and_creates_none(
    local_cluster: ClusterInfo,
) -> None:
    info, env, kubectl = local_cluster, local_cluster.kube_env(), str(local_cluster.kubectl)
    run(kubectl, "create", "namespace", NS, env=env)
    munge, jwt = "m" * 1024, "j" * 64
    for doc in (
        _site_secret("site-munge", "munge.key", munge),
        _site_secret("site-jwt", "jwt_hs256.key", jwt),
    ):
        run(kubectl, "apply", "-f", "-", env=env, stdin=doc)
    # The Slurm side only (no controller, agent or admission policies in the shared
    # cluster); without a controller the chart requires both names.
    values = (
        *("--set", "controller.enabled=false", "--set", "agent.enabled=false"),
        *("--set", "cleanupOnUninstall.enabled=false"),
        *("--set", "slurm.controller.persistence.enabled=false"),
        *("--set", "slurm.munge.secretRef=site-munge", "--set", "slurm.jwt.secretRef=site-jwt"),
    )
    try:
        for verb in ("install", "upgrade"):
            run(helm(), verb, RELEASE, str(CHART), "-n", NS, *values, env=env)
            secrets = _kubectl_json(info, "-n", NS, "get", "secrets")["items"]
            names = {s["metadata"]["name"] for s in secrets if s["type"] != "helm.sh/release.v1"}
            assert names == {"site-munge", "site-jwt"}, verb
            data = {s["metadata"]["name"]: s["data"] for s in secrets}
            assert base64.b64decode(data["site-munge"]["munge.key"]).decode() == munge
            assert base64.b64decode(data["site-jwt"]["jwt_hs256.key"]).decode() == jwt
            mounted: dict[str, set[str]] = {}
            for kind in ("statefulsets", "deployments", "daemonsets"):
                for w in _kubectl_json(info, "-n", NS, "get", kind)["items"]:
                    for v in w["spec"]["template"]["spec"].get("volumes", []):
                        if "secret" in v:
                            mounted.setdefault(v["secret"]["secretName"], set()).add(
                                w["metadata"]["name"]
                            )
            assert set(mounted) == {"site-munge", "site-jwt"}, mounted
            assert f"{RELEASE}-gpufleet-slurm-controller" in mounted["site-munge"]
            assert f"{RELEASE}-gpufleet-slurm-rest" in mounted["site-jwt"]
    finally:
        run(helm(), "uninstall", RELEASE, "-n", NS, "--ignore-not-found", env=env)
        run(kubectl, "delete", "namespace", NS, "--wait=false", env=env)


def test_the_controller_creates_a_missing_key_once_and_keeps_an_existing_one(
    local_cluster: ClusterInfo,
) -> None:
    ns = "default"
    fresh = GeneratedSecret("gitops-fresh-munge-key", "munge.key", 1024)
    kept = GeneratedSecret("gitops-kept-slurm-jwt", "jwt_hs256.key", 64)
    previous = base64.b64encode(b"k" * 64).decode()

    async def scenario() -> None:
        kube = await KubeApi.connect(str(local_cluster.kubeconfig))
        try:
            # What the previous chart left: its own Secret, helm's annotations on it.
            await kube.create(
                SECRETS,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": kept.name,
                        "annotations": {"helm.sh/resource-policy": "keep"},
                    },
                    "data": {kept.key: previous},
                },
                namespace=ns,
            )
            assert await ensure(kube, ns, [fresh, kept]) == [fresh.name]
            first = await kube.get(SECRETS, fresh.name, namespace=ns)
            value = base64.b64decode(first["data"][fresh.key])
            assert len(value) == 1024 and value.isalnum()
            # A second replica, or the next start: nothing created, nothing changed.
            assert await ensure(kube, ns, [fresh, kept]) == []
            again = await kube.get(SECRETS, fresh.name, namespace=ns)
            assert again["data"] == first["data"]
            old = await kube.get(SECRETS, kept.name, namespace=ns)
            assert old["data"] == {kept.key: previous}
        finally:
            for name in (fresh.name, kept.name):
                await kube.delete(SECRETS, name, namespace=ns)

    asyncio.run(scenario())
