"""The charts as a release ships them: packaged, pushed to an OCI registry, installed from it,
upgraded to the checkout's chart, and the CRDs upgraded to the next API version.

Everything runs the release workflow's own scripts (``scripts/release/package-chart`` and
``push-chart``), the real CNCF distribution registry on 127.0.0.1 (built by
scripts/build-registry.sh, which the test command runs) and helm against a private local
cluster (etcd, kube-apiserver, one KWOK node): its CRDs are changed here, and every other
module's cluster keeps its own. Pods need not run; the apiserver is what is tested.

The steps, each on the state the one before left (decision 0184, docs/upgrade.md):

1. both charts packaged at the project's version and pushed;
2. ``helm install oci://...`` of the main chart: its ``crds/`` create the CRDs;
3. an object of every kind, at v1alpha1;
4. the CRD chart takes the CRDs over (``--take-ownership``), and upgrading the main chart
   from the OCI package to the checkout's chart keeps them;
5. the CRD chart upgraded to the next API version (v1beta1 served beside v1alpha1, same
   schema, no conversion, storage moved): every object is readable at both;
6. the storage migration of docs/upgrade.md: each object rewritten in v1beta1, then
   v1alpha1 dropped from the CRD's ``storedVersions``;
7. uninstalling the CRD chart keeps the CRDs and the objects;
8. on a cluster with no gpufleet CRDs, docs/install.md's order: the CRD chart, then the main
   chart, both from the registry; the CRD chart owns the CRDs and upgrades them.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from test_slurm_chart import helm_binary
from waiting import wait_for

import gpufleet
from gpufleet.api import crds
from gpufleet.local.cluster import ClusterInfo, ClusterSpec, LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.steps]

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "deploy" / "helm"
VERSION = gpufleet.__version__
NS = "gpufleet-release"
GROUP = "gpufleet.io"
OLD, NEXT = "v1alpha1", "v1beta1"
PLURALS = sorted(m["spec"]["names"]["plural"] for m in crds.manifests().values())
# One object of each kind the chart does not create itself (the chart makes the SlurmCluster).
OBJECTS: dict[str, dict[str, Any]] = {
    "fleetpolicies": {"kind": "FleetPolicy", "spec": {"paused": True}},
    "noderemediations": {"kind": "NodeRemediation", "spec": {"node": "n-1", "fault": "xid79"}},
    "machines": {
        "kind": "Machine",
        "spec": {
            "macs": ["02:00:00:00:00:01"],
            "serial": "SN-RELEASE-1",
            "bmc": {"endpoint": "https://127.0.0.1:8443", "credentialsSecret": "bmc/rack1"},
            "hardware": {"gpuModel": "H100", "gpuCount": 8, "hcaCount": 8},
        },
    },
    "maintenanceplans": {
        "kind": "MaintenancePlan",
        "spec": {"nodeSelector": {"gpufleet.io/pool": "none"}, "action": "noop"},
    },
    "tenants": {"kind": "Tenant", "spec": {"namespaces": ["release-check"]}},
}


@dataclass
class Release:
    """The private cluster, the registry and helm's own homes for this module."""

    info: ClusterInfo
    registry: str  # oci://127.0.0.1:PORT/charts
    env: dict[str, str]  # KUBECONFIG and helm's homes, for helm, kubectl and the scripts
    work: Path
    helm: str

    def run(self, *args: str, stdin: str | None = None) -> str:
        r = subprocess.run(
            args, capture_output=True, text=True, env=self.env, input=stdin, timeout=180
        )
        assert r.returncode == 0, f"{' '.join(args)}:\n{r.stdout}\n{r.stderr}"
        return r.stdout

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self.run(str(self.info.kubectl), *args, stdin=stdin)

    def get(self, what: str, name: str = "", *flags: str) -> Any:
        return json.loads(
            self.kubectl("get", what, *([name] if name else []), *flags, "-o", "json")
        )

    def listed(self, release: str) -> dict[str, Any]:
        """``helm list``'s entry: revision, status, chart (name-version), app_version."""
        (entry,) = [
            r
            for r in json.loads(self.run(self.helm, "list", "-n", NS, "-a", "-o", "json"))
            if r["name"] == release
        ]
        out: dict[str, Any] = entry
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def registry_binary() -> Path:
    cache = Path(os.environ.get("GPUFLEET_CACHE", Path.home() / ".cache" / "gpufleet")) / "bin"
    found = sorted(cache.glob("registry-*/registry"), reverse=True)
    assert found, "the OCI registry is not built: run scripts/build-registry.sh (scripts/test does)"
    return found[0]


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    helm = helm_binary()
    assert helm, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    work = tmp_path_factory.mktemp("release")
    port = free_port()
    config = {
        "version": 0.1,
        "log": {"level": "error", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(work / "registry")}},
        "http": {"addr": f"127.0.0.1:{port}", "secret": "gpufleet-test"},
    }
    (work / "registry.yml").write_text(yaml.safe_dump(config))
    log = (work / "registry.log").open("w")
    registry = subprocess.Popen(
        [str(registry_binary()), "serve", str(work / "registry.yml")],
        stdout=log,
        stderr=log,
        # No trace export: it would post to localhost:4318 every few seconds, to nothing.
        env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
    )
    try:
        wait_for(
            "the registry to answer /v2/",
            lambda: registry.poll() is None and _answers(f"http://127.0.0.1:{port}/v2/"),
            timeout=30,
        )
        with LocalCluster(ClusterSpec(nodes=1, slurm=False, redfish=False)) as info:
            env = {
                **info.kube_env(),
                "HELM": helm,
                **{
                    f"HELM_{home}_HOME": str(work / "helm" / home.lower())
                    for home in ("CACHE", "CONFIG", "DATA")
                },
                "HELM_REGISTRY_CONFIG": str(work / "helm" / "registry.json"),
            }
            yield Release(info, f"oci://127.0.0.1:{port}/charts", env, work, helm)
    finally:
        registry.terminate()
        try:
            registry.wait(10)
        except subprocess.TimeoutExpired:
            registry.kill()
            registry.wait()
        log.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_both_charts_are_packaged_and_pushed(release: Release) -> None:
    packages = release.run(
        str(ROOT / "scripts/release/package-chart"), str(release.work / "charts")
    ).split()
    assert [Path(p).name for p in packages] == [
        f"gpufleet-crds-{VERSION}.tgz",
        f"gpufleet-{VERSION}.tgz",
    ]
    pushed = release.run(
        str(ROOT / "scripts/release/push-chart"), "--plain-http", release.registry, *packages
    )
    host = release.registry.removeprefix("oci://")
    for chart in ("gpufleet-crds", "gpufleet"):
        assert f"{host}/{chart}:{VERSION}\n  digest sha256:" in pushed, pushed
    shown = yaml.safe_load(
        release.run(
            release.helm, "show", "chart", f"{release.registry}/gpufleet",
            "--version", VERSION, "--plain-http",
        )
    )  # fmt: skip
    assert (shown["version"], shown["appVersion"]) == (VERSION, VERSION)
    assert shown["kubeVersion"] == ">=1.30.0-0"
    # A tag that is not the project's version packages nothing (the release workflow's check).
    refused = subprocess.run(
        [str(ROOT / "scripts/release/package-chart"), "--version", "v99.0.0", str(release.work)],
        capture_output=True, text=True, env=release.env, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout
    assert f"asked for 99.0.0, the project is at {VERSION}" in refused.stderr


def test_the_chart_installs_from_the_registry(release: Release) -> None:
    release.run(
        release.helm, "install", "gpufleet", f"{release.registry}/gpufleet",
        "--version", VERSION, "--plain-http", "-n", NS, "--create-namespace",
    )  # fmt: skip
    listed = release.listed("gpufleet")
    assert (listed["status"], listed["revision"]) == ("deployed", "1")
    assert (listed["chart"], listed["app_version"]) == (f"gpufleet-{VERSION}", VERSION)
    # The CRDs came from the package's crds/; the chart's own SlurmCluster is served.
    for plural in PLURALS:
        crd = release.get("crd", f"{plural}.{GROUP}")
        assert [v["name"] for v in crd["spec"]["versions"]] == [OLD]
    assert release.get(f"slurmclusters.{OLD}.{GROUP}", "", "-n", NS)["items"]


def test_objects_of_every_kind_are_created_at_this_version(release: Release) -> None:
    docs = [
        {"apiVersion": f"{GROUP}/{OLD}", "metadata": {"name": "release-check"}, **obj}
        for obj in OBJECTS.values()
    ]
    release.kubectl("create", "-f", "-", stdin=yaml.safe_dump_all(docs))
    for plural in OBJECTS:
        assert release.get(f"{plural}.{OLD}.{GROUP}", "release-check")["spec"]


def test_the_crd_chart_takes_over_and_the_main_chart_upgrades_to_the_checkout(
    release: Release,
) -> None:
    release.run(
        release.helm, "upgrade", "--install", "gpufleet-crds",
        f"{release.registry}/gpufleet-crds", "--version", VERSION, "--plain-http",
        "-n", NS, "--take-ownership",
    )  # fmt: skip
    for plural in PLURALS:
        meta = release.get("crd", f"{plural}.{GROUP}")["metadata"]
        assert meta["annotations"]["meta.helm.sh/release-name"] == "gpufleet-crds"
        assert meta["annotations"]["helm.sh/resource-policy"] == "keep"
    release.run(
        release.helm, "upgrade", "gpufleet", str(CHARTS / "gpufleet"), "-n", NS, "--skip-crds"
    )
    listed = release.listed("gpufleet")
    assert (listed["status"], listed["revision"]) == ("deployed", "2")
    for plural in OBJECTS:
        assert release.get(f"{plural}.{OLD}.{GROUP}", "release-check")["spec"]
    assert release.get(f"slurmclusters.{OLD}.{GROUP}", "", "-n", NS)["items"]


def next_crd_chart(out: Path) -> Path:
    """This checkout's CRD chart as the release that adds v1beta1 would ship it: v1beta1
    served beside v1alpha1 with the same schema, no conversion, v1beta1 the storage."""
    shutil.copytree(CHARTS / "gpufleet-crds", out)
    chart = yaml.safe_load((out / "Chart.yaml").read_text())
    major, minor, _ = VERSION.split(".", 2)
    chart["version"] = chart["appVersion"] = f"{major}.{int(minor) + 1}.0"
    (out / "Chart.yaml").write_text(yaml.safe_dump(chart, sort_keys=False))
    for template in (out / "templates").glob("*.yaml"):
        crd = yaml.safe_load(template.read_text())
        (old,) = crd["spec"]["versions"]
        new = {**copy.deepcopy(old), "name": NEXT, "storage": True}
        crd["spec"]["versions"] = [{**old, "storage": False}, new]
        crd["spec"]["conversion"] = {"strategy": "None"}
        template.write_text(yaml.safe_dump(crd, sort_keys=False))
    return out


def test_the_crds_upgrade_to_the_next_version_and_every_object_reads_at_both(
    release: Release,
) -> None:
    before = {p: release.get(f"{p}.{OLD}.{GROUP}", "release-check") for p in OBJECTS}
    release.run(
        release.helm, "upgrade", "gpufleet-crds", str(next_crd_chart(release.work / "next")),
        "-n", NS,
    )  # fmt: skip
    release.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    for plural in PLURALS:
        crd = release.get("crd", f"{plural}.{GROUP}")
        versions = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
        assert versions == {OLD: (True, False), NEXT: (True, True)}
        assert crd["status"]["storedVersions"] == [OLD, NEXT]
    for plural, old in before.items():
        for version in (OLD, NEXT):
            now = wait_for(
                f"{plural} at {version}",
                functools.partial(_get_or_none, release, f"{plural}.{version}.{GROUP}"),
            )
            assert now["apiVersion"] == f"{GROUP}/{version}"
            assert now["spec"] == old["spec"]
            assert now["metadata"]["uid"] == old["metadata"]["uid"]
    # Written at the next version, read at this one.
    doc = {"apiVersion": f"{GROUP}/{NEXT}", "metadata": {"name": "written-at-next"}}
    release.kubectl("create", "-f", "-", stdin=json.dumps({**doc, **OBJECTS["fleetpolicies"]}))
    assert release.get(f"fleetpolicies.{OLD}.{GROUP}", "written-at-next")["spec"]["paused"]


def _get_or_none(release: Release, what: str) -> dict[str, Any] | None:
    r = subprocess.run(
        [str(release.info.kubectl), "get", what, "release-check", "-o", "json"],
        capture_output=True, text=True, env=release.env, timeout=30,
    )  # fmt: skip
    return json.loads(r.stdout) if r.returncode == 0 else None


def stored(release: Release, plural: str) -> dict[str, str]:
    """Object name -> the apiVersion it is stored in, read from etcd itself (custom resources
    are stored as JSON under /registry/<group>/<plural>/)."""
    prefix = f"/registry/{GROUP}/{plural}/".encode()
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    answer = httpx.post(
        f"{release.info.etcd_url}/v3/kv/range",
        json={
            "key": base64.b64encode(prefix).decode(),
            "range_end": base64.b64encode(end).decode(),
        },
        timeout=10,
    ).json()
    return {
        base64.b64decode(kv["key"]).decode().rsplit("/", 1)[-1]: json.loads(
            base64.b64decode(kv["value"])
        )["apiVersion"]
        for kv in answer.get("kvs", [])
    }


def test_the_storage_migration_rewrites_every_object_and_drops_the_old_version(
    release: Release,
) -> None:
    """docs/upgrade.md's procedure: a replace of every object as it reads writes it again in
    the storage version; then v1alpha1 leaves each CRD's ``storedVersions``."""
    for plural in PLURALS:
        before = stored(release, plural)
        assert before, plural
        # Until the migration, what was written before the upgrade stays stored at v1alpha1.
        if plural in OBJECTS:
            assert before["release-check"] == f"{GROUP}/{OLD}"
        listed = release.get(f"{plural}.{NEXT}.{GROUP}", "", "-A")
        release.kubectl("replace", "-f", "-", stdin=json.dumps(listed))
        assert set(stored(release, plural).values()) == {f"{GROUP}/{NEXT}"}, plural
        release.kubectl(
            "patch", "crd", f"{plural}.{GROUP}", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"storedVersions": [NEXT]}}),
        )  # fmt: skip
        assert release.get("crd", f"{plural}.{GROUP}")["status"]["storedVersions"] == [NEXT]
    assert stored(release, "fleetpolicies")["written-at-next"] == f"{GROUP}/{NEXT}"


def test_uninstalling_the_crd_chart_keeps_the_crds_and_the_objects(release: Release) -> None:
    release.run(release.helm, "uninstall", "gpufleet-crds", "-n", NS)
    for plural in PLURALS:
        assert release.get("crd", f"{plural}.{GROUP}")["metadata"]["name"]
    for plural in OBJECTS:
        assert release.get(f"{plural}.{NEXT}.{GROUP}", "release-check")["spec"]


def test_a_fresh_install_in_the_documented_order(release: Release) -> None:
    """docs/install.md's order on a cluster with no gpufleet CRDs: the CRD chart first, then
    the main chart, both from the registry. The main chart's ``crds/`` find the CRDs there and
    leave them to the CRD chart, which owns them and upgrades them later."""
    # No hooks: the uninstall Job's pod would never run on this cluster's KWOK node.
    release.run(release.helm, "uninstall", "gpufleet", "-n", NS, "--wait", "--no-hooks")
    names = [f"{plural}.{GROUP}" for plural in PLURALS]
    release.kubectl("delete", "crd", *names, "--wait=true", "--timeout=120s")
    for name in names:
        assert "NotFound" in _refused(release, "get", "crd", name)
    fresh = NS  # the namespace kept what the chart keeps (its generated Secrets)
    for chart in ("gpufleet-crds", "gpufleet"):
        release.run(
            release.helm, "install", chart, f"{release.registry}/{chart}",
            "--version", VERSION, "--plain-http", "-n", fresh,
        )  # fmt: skip
        listed = json.loads(release.run(release.helm, "list", "-n", fresh, "-o", "json"))
        assert {r["name"]: r["status"] for r in listed}[chart] == "deployed"
    for plural in PLURALS:
        meta = release.get("crd", f"{plural}.{GROUP}")["metadata"]
        assert meta["annotations"]["meta.helm.sh/release-name"] == "gpufleet-crds"
        assert meta["annotations"]["meta.helm.sh/release-namespace"] == fresh
    assert release.get(f"slurmclusters.{OLD}.{GROUP}", "", "-n", fresh)["items"]
    # The CRD chart upgrades what it installed (helm never upgrades a chart's crds/).
    release.run(
        release.helm, "upgrade", "gpufleet-crds", str(next_crd_chart(release.work / "again")),
        "-n", fresh,
    )  # fmt: skip
    crd = release.get("crd", f"fleetpolicies.{GROUP}")
    assert [v["name"] for v in crd["spec"]["versions"]] == [OLD, NEXT]


def _refused(release: Release, *args: str) -> str:
    r = subprocess.run(
        [str(release.info.kubectl), *args], capture_output=True, text=True, env=release.env,
        timeout=60,
    )  # fmt: skip
    assert r.returncode != 0, r.stdout
    return r.stderr
