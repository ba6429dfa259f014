"""TLS to BMCs through the chart: a BMC Secret the chart renders with ca.crt and certSha256,
stored in the session's real apiserver and read back the way the controller reads it, reaches
the Redfish emulator serving HTTPS with a certificate from a CA of its own; a pin that is not
the BMC's refuses it with no request sent. The chart-wide bundle is mounted into the
controller from a ConfigMap or a Secret (docs/security.md, "TLS to BMCs").
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from test_slurm_chart import CHART, helm_binary, run

from gpufleet.kubeapi import SECRETS, KubeApi
from gpufleet.kubeapi.machines import MachineStore
from gpufleet.local import pki
from gpufleet.local import redfish as emulator
from gpufleet.local.cluster import ClusterInfo
from gpufleet.remediate import bmc_tls, machine_power, redfish

pytestmark = pytest.mark.integration

NS = "gpufleet-bmctls"
BMC_NS = f"{NS}-bmc"


def helm() -> str:
    path = helm_binary()
    assert path is not None, "helm is not built: run scripts/build-helm.sh (scripts/test does)"
    return path


def render(*extra: str) -> list[dict[str, Any]]:
    out = run(
        helm(), "template", "gpufleet", str(CHART), "-n", NS,
        "--set", f"bmcSecretsNamespace={BMC_NS}", "--set", "createBmcSecretsNamespace=false",
        "--set", f"controller.tickets.evidenceNamespace={NS}-evidence", *extra,
    )  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def controller_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deploy = next(
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-controller")
    )
    spec: dict[str, Any] = deploy["spec"]["template"]["spec"]
    return spec


def test_the_bundle_is_mounted_from_a_configmap_or_a_secret_and_named_to_the_controller() -> None:
    for kind, source in (("configMap", {"name": "bmc-ca"}), ("secret", {"secretName": "bmc-ca"})):
        pod = controller_pod(
            render(*_set(**{f"caBundle.{kind}": "bmc-ca", "caBundle.key": "trust.pem"}))
        )
        (volume,) = [v for v in pod["volumes"] if v["name"] == "bmc-ca"]
        assert volume[kind] == {**source, "items": [{"key": "trust.pem", "path": "ca.crt"}]}
        (container,) = pod["containers"]
        assert {"name": "bmc-ca", "mountPath": "/etc/gpufleet/bmc-ca", "readOnly": True} in (
            container["volumeMounts"]
        )
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["GPUFLEET_BMC_CA_BUNDLE"] == "/etc/gpufleet/bmc-ca/ca.crt"
    pod = controller_pod(render())
    assert "bmc-ca" not in {v["name"] for v in pod["volumes"]}
    assert "GPUFLEET_BMC_CA_BUNDLE" not in {e["name"] for e in pod["containers"][0]["env"]}


def _set(**values: str) -> list[str]:
    """``--set bmcCredentials.<key>=<value>`` for each."""
    return [a for k, v in values.items() for a in ("--set", f"bmcCredentials.{k}={v}")]


def test_the_chart_refuses_two_bundles_and_a_pin_that_is_not_hex() -> None:
    def fails(*extra: str) -> str:
        r = subprocess.run(
            [helm(), "template", "g", str(CHART), "-n", NS, *extra],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert r.returncode != 0, extra
        return r.stderr

    both = fails(*_set(**{"caBundle.configMap": "a", "caBundle.secret": "b"}))
    assert "set configMap or secret, not both" in both
    item = {"name": "r", "endpoint": "https://x", "username": "u", "password": "p"}
    item["certSha256"] = "not-a-fingerprint"
    pin = fails(*_set(**{f"create[0].{k}": v for k, v in item.items()}))
    assert "certSha256" in pin


@pytest.fixture(scope="module")
def https_bmc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, pki.BmcPki]]:
    files = pki.create_bmc(tmp_path_factory.mktemp("bmc-pki"), ips=["127.0.0.1"])
    entry = {"node": "m-tls", "port": 0, "tls": files.emulator_tls()}
    with emulator.serving({"user": "admin", "password": "pw", "bmcs": [entry]}) as (server,):
        yield server.bmc, f"https://127.0.0.1:{server.server_address[1]}", files  # type: ignore[attr-defined]


def _fingerprint(cert: Path) -> str:
    loaded = x509.load_pem_x509_certificate(cert.read_bytes())
    return bmc_tls.fingerprint(loaded.public_bytes(serialization.Encoding.DER))


def test_a_secret_the_chart_renders_reaches_the_bmc_through_the_apiserver(
    local_cluster: ClusterInfo, https_bmc: tuple[Any, str, pki.BmcPki]
) -> None:
    state, url, files = https_bmc
    values = {
        "bmcCredentials": {
            "create": [
                {
                    "name": "bmc-m-tls",
                    "endpoint": url,
                    "username": "admin",
                    "password": "pw",
                    "caCert": files.ca_cert.read_text(),
                    "certSha256": _fingerprint(files.cert),
                }
            ]
        }
    }
    values_file = files.dir / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    (secret,) = [
        d for d in render("-f", str(values_file))
        if d["kind"] == "Secret" and d["metadata"]["name"] == "bmc-m-tls"
    ]  # fmt: skip
    env = local_cluster.kube_env()
    kubectl = str(local_cluster.kubectl)
    run(kubectl, "create", "namespace", BMC_NS, env=env)
    machine = {
        "metadata": {"name": "m-tls"},
        "spec": {"bmc": {"endpoint": url, "credentialsSecret": f"{BMC_NS}/bmc-m-tls"}},
    }

    async def read_serial(store: MachineStore) -> str | None:
        creds = await machine_power.machine_credentials(store, machine)
        async with redfish.RedfishClient(creds, name="m-tls", retry_delays=(0.05,)) as bmc:
            return await bmc.serial_number()

    async def scenario() -> None:
        kube = await KubeApi.connect(str(local_cluster.kubeconfig))
        store = MachineStore(kube)
        assert await read_serial(store) == "SN-m-tls"
        # Another certificate's fingerprint: refused before the first request.
        await kube.patch(
            SECRETS, "bmc-m-tls", {"stringData": {"certSha256": "ab" * 32}}, namespace=BMC_NS
        )
        before = state.requests
        with pytest.raises(redfish.BmcTlsError) as err:
            await read_serial(store)
        assert state.requests == before
        assert f"not the certSha256 of Secret {BMC_NS}/bmc-m-tls" in str(err.value)

    try:
        run(kubectl, "apply", "-f", "-", env=env, stdin=json.dumps(secret))
        asyncio.run(scenario())
    finally:
        run(kubectl, "delete", "namespace", BMC_NS, "--wait=false", env=env)
