"""Day 0 against the real apiserver (bootstrap-token authenticator on) and the BMC emulator:
iPXE and cloud-init for known MACs only, single-use tokens that really authenticate,
refusals with audit Events, 100 concurrent boots, inventory import from the CLI."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from controller_harness import (
    GV,
    SYSTEM_NS,
    Api,
    free_port,
    install,
    issue_join_token,
    self_subject_review,
    wait_for,
)

from gpufleet.domain import enrollment, well_known
from gpufleet.kubeapi import KubeApi
from gpufleet.provision import machines, render
from gpufleet.provision.issuer import Provisioner, Refused, ServiceSettings
from gpufleet.provision.server import ServeOptions, boot_config, in_thread

pytestmark = pytest.mark.integration

SECRET = "enrol-me-please"
HEADER = (
    "name,macs,serial,bmc_endpoint,bmc_secret,pool,gpu_model,gpu_count,hca_count,"
    "ib_leaf,ib_block,enrollment_digest\n"
)


def csv_row(name: str, mac: str, serial: str, bmc_url: str, digest: str = "") -> str:
    return (
        f"{name},{mac},{serial},{bmc_url},{SYSTEM_NS}/bmc-{name},train,NVIDIA-H100-80GB-HBM3,"
        f"8,8,ib-leaf-007,ib-block-a,{digest}\n"
    )


def bmc_secret(api: Api, name: str, bmc: Any) -> None:
    data = {
        k: base64.b64encode(v.encode()).decode()
        for k, v in {"endpoint": bmc.url, "username": bmc.user, "password": bmc.password}.items()
    }
    api.post(
        f"/api/v1/namespaces/{SYSTEM_NS}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"bmc-{name}"}, "data": data},
        ok=(201, 409),
    )


def token_of(user_data: str) -> str:
    doc = yaml.safe_load(user_data.removeprefix("#cloud-config\n"))
    join = yaml.safe_load(doc["write_files"][0]["content"])
    return str(join["discovery"]["bootstrapToken"]["token"])


def audit_reasons(api: Api, machine: str) -> list[str]:
    items = api.get(
        f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{machine}"
    )["items"]
    return [
        e["reason"] for e in items if e.get("source", {}).get("component") == well_known.PROVISIONER
    ]


@pytest.fixture(scope="module")
def env(local_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    api = Api(local_cluster)
    install(api)
    port = free_port()
    options = ServeOptions(kubeconfig=local_cluster.kubeconfig, port=port)
    try:
        with in_thread(options, ServiceSettings()) as url:
            yield local_cluster, api, url, tmp_path_factory.mktemp("inventory")
    finally:
        api.delete(f"{GV}/machines?labelSelector=gpufleet.io%2Fpool%3Dtrain")
        api.delete(f"{GV}/machines?labelSelector=gpufleet.io%2Fpool%3Dswarm")
        api.delete(
            "/api/v1/namespaces/kube-system/secrets?labelSelector=" + well_known.LABEL_MACHINE
        )


def await_(coro: Any) -> Any:
    return asyncio.run(coro)


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", *args], capture_output=True, text=True
    )


def test_import_rejects_a_malformed_file_with_the_line_and_creates_nothing(env: Any) -> None:
    info, api, _url, tmp = env
    bad = tmp / "bad.csv"
    bad.write_text(
        HEADER
        + csv_row("day0-bad-a", "aa:00:00:00:0a:01", "SN-a", "http://127.0.0.1:1")
        + csv_row("day0-bad-b", "aa:00:00:00:0a:zz", "SN-b", "http://127.0.0.1:1")
    )
    done = gpufleet("machines", "import", str(bad), "--kubeconfig", str(info.kubeconfig))
    assert done.returncode == 2  # wrong input (docs/cli.md)
    assert f"{bad}:3: " in done.stderr and "not a MAC address" in done.stderr
    assert api.http.get(f"{GV}/machines/day0-bad-a").status_code == 404


def test_a_known_mac_boots_and_its_token_authenticates_once(env: Any) -> None:
    info, api, url, tmp = env
    bmc = info.bmcs[info.node_names[2]]
    bmc_secret(api, "day0-known", bmc)
    inv = tmp / "rack.csv"
    digest = enrollment.digest(SECRET)
    inv.write_text(HEADER + csv_row("day0-known", "AA-00-00-00-01-01", "SN-x", bmc.url, digest))
    done = gpufleet("machines", "import", str(inv), "--kubeconfig", str(info.kubeconfig))
    assert done.returncode == 0, done.stderr
    assert "created day0-known" in done.stdout
    table = gpufleet("machines", "--kubeconfig", str(info.kubeconfig))
    assert "day0-known" in table.stdout and "8x NVIDIA-H100-80GB-HBM3" in table.stdout

    script = httpx.get(f"{url}/ipxe", params={"mac": "aa:00:00:00:01:01"})
    assert script.status_code == 200 and script.text.startswith("#!ipxe\n")
    assert "kernel http://boot.example/gpufleet/vmlinuz" in script.text
    assert f"s={url}/cloud-init/aa:00:00:00:01:01/" in script.text
    meta = httpx.get(f"{url}/cloud-init/aa:00:00:00:01:01/meta-data")
    assert yaml.safe_load(meta.text)["local-hostname"] == "day0-known"
    # The seed's other two documents answer at once (cloud-init retries a 404 for 10 s).
    for seed in ("cloud-init/aa:00:00:00:01:01", "cloud-init/aa:00:00:00:01:01/serial/SN-x"):
        vendor = httpx.get(f"{url}/{seed}/vendor-data")
        assert (vendor.status_code, vendor.text) == (200, "")
        network = httpx.get(f"{url}/{seed}/network-config")
        assert network.status_code == 200
        assert yaml.safe_load(network.text) == {"config": "disabled"}

    # Without credentials, or with the wrong secret: nothing, and an audit Event.
    data_url = f"{url}/cloud-init/aa:00:00:00:01:01/user-data"
    assert httpx.get(data_url).status_code == 403
    wrong = httpx.get(data_url, headers={"X-Gpufleet-Enrollment": "guess"})
    assert wrong.status_code == 403 and "token" not in wrong.text
    got = httpx.get(data_url, headers={"X-Gpufleet-Enrollment": SECRET})
    assert got.status_code == 200, got.text
    assert got.headers["cache-control"] == "no-store"
    token = token_of(got.text)
    token_id, _ = enrollment.parse_token(token) or ("", "")
    assert token_id, token
    doc = yaml.safe_load(got.text.removeprefix("#cloud-config\n"))
    join = yaml.safe_load(doc["write_files"][0]["content"])
    config = boot_config(ServeOptions(kubeconfig=info.kubeconfig))
    assert join["discovery"]["bootstrapToken"]["apiServerEndpoint"] == config.apiserver
    assert join["discovery"]["bootstrapToken"]["caCertHashes"] == [config.ca_hash]
    labels = join["nodeRegistration"]["kubeletExtraArgs"][0]["value"]
    for label in (
        "gpufleet.io/state=provisioning",
        "gpufleet.io/pool=train",
        "gpufleet.io/machine=day0-known",
        "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
        "gpufleet.io/ib-leaf=ib-leaf-007",
        "gpufleet.io/ib-block=ib-block-a",
    ):
        assert label in labels

    # A real bootstrap token in kube-system, bound to the machine, kubeadm's usages and groups.
    secret = api.get(f"/api/v1/namespaces/kube-system/secrets/bootstrap-token-{token_id}")
    assert secret["type"] == "bootstrap.kubernetes.io/token"
    assert secret["metadata"]["labels"][well_known.LABEL_MACHINE] == "day0-known"
    fields = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert fields["usage-bootstrap-authentication"] == "true"
    assert fields["usage-bootstrap-signing"] == "true"
    assert fields["auth-extra-groups"] == "system:bootstrappers:kubeadm:default-node-token"
    review = self_subject_review(info, token)
    assert review.status_code == 201, review.text
    user = review.json()["status"]["userInfo"]
    assert user["username"] == f"system:bootstrap:{token_id}"
    assert "system:bootstrappers" in user["groups"]

    # The same boot asks again: no new token until the machine is re-armed.
    again = httpx.get(data_url, headers={"X-Gpufleet-Enrollment": SECRET})
    assert again.status_code == 409 and "token" not in again.text.replace("no token", "")
    status = api.get(f"{GV}/machines/day0-known")["status"]
    assert status["armed"] is False and status["tokenId"] == token_id
    done = gpufleet(
        "machines", "rearm", "day0-known", "--reason", "test", "--kubeconfig", str(info.kubeconfig)
    )
    assert done.returncode == 0, done.stderr
    # Re-arming revoked the old token: the apiserver no longer accepts it.
    wait_for(
        "old token refused", lambda: self_subject_review(info, token).status_code == 401, timeout=20
    )
    fresh = httpx.get(data_url, headers={"X-Gpufleet-Enrollment": SECRET})
    assert fresh.status_code == 200 and token_of(fresh.text) != token
    wait_for(
        "audit Events",
        lambda: {"TokenIssued", "TokenRefused"} <= set(audit_reasons(api, "day0-known")),
        timeout=10,
    )


def test_the_serial_authenticates_only_when_the_bmc_agrees(env: Any) -> None:
    info, api, url, _tmp = env
    node = info.node_names[2]
    bmc = info.bmcs[node]
    bmc_secret(api, "day0-serial", bmc)
    spec = machines.MachineSpec.model_validate(
        {
            "macs": ["aa:00:00:00:02:01"],
            "serial": f"SN-{node}",  # what the emulated BMC reports
            "bmc": {"endpoint": bmc.url, "credentialsSecret": f"{SYSTEM_NS}/bmc-day0-serial"},
            "pool": "train",
            "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
        }
    )
    api.post(f"{GV}/machines", machines.manifest("day0-serial", spec))
    data_url = f"{url}/cloud-init/aa:00:00:00:02:01/user-data"
    assert httpx.get(data_url, headers={"X-Gpufleet-Serial": "SN-forged"}).status_code == 403
    ok = httpx.get(data_url, headers={"X-Gpufleet-Serial": f"SN-{node}"})
    assert ok.status_code == 200, ok.text


def test_an_unknown_mac_gets_a_bare_404_an_event_and_a_metric(env: Any) -> None:
    _info, api, url, _tmp = env
    for path in (
        "/ipxe?mac=de:ad:be:ef:00:01",
        "/cloud-init/de:ad:be:ef:00:01/user-data",
        "/cloud-init/de:ad:be:ef:00:01/vendor-data",
    ):
        r = httpx.get(url + path, headers={"X-Gpufleet-Enrollment": SECRET})
        assert r.status_code == 404 and r.text == "not found\n"
    metrics = httpx.get(f"{url}/metrics").text
    assert "gpufleet_provision_unknown_mac_total 3.0" in metrics
    wait_for(
        "UnknownMachine Event",
        lambda: "UnknownMachine" in audit_reasons(api, "unknown"),
        timeout=10,
    )
    assert httpx.get(f"{url}/openapi.json").json()["paths"]["/ipxe"]


def test_one_mac_hammering_is_rate_limited(env: Any) -> None:
    _info, _api, url, _tmp = env

    async def hammer() -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            answers = await asyncio.gather(
                *(http.get("/ipxe", params={"mac": "de:ad:be:ef:00:02"}) for _ in range(20))
            )
        return [r.status_code for r in answers]

    codes = await_(hammer())
    assert set(codes) == {404, 429}
    assert 10 <= codes.count(404) <= 12  # the burst, plus what refills meanwhile (1/s)


def test_a_short_lived_token_stops_working_after_it_expires(env: Any) -> None:
    info, api, _url, _tmp = env
    token = issue_join_token(info, api, "day0-expiry", "aa:00:00:00:03:01", ttl_s=3)
    assert self_subject_review(info, token).status_code == 201
    start = time.monotonic()
    wait_for(
        "expired token refused",
        lambda: self_subject_review(info, token).status_code == 401,
        timeout=30,
    )
    assert time.monotonic() - start >= 1.0


def test_100_concurrent_boots_get_100_distinct_tokens(env: Any) -> None:
    _info, api, url, _tmp = env
    macs = [f"aa:00:00:01:{i // 256:02x}:{i % 256:02x}" for i in range(100)]
    for i, mac in enumerate(macs):
        spec = machines.MachineSpec.model_validate(
            {
                "macs": [mac],
                "serial": f"SN-swarm-{i}",
                "bmc": {"endpoint": "http://127.0.0.1:1", "credentialsSecret": f"{SYSTEM_NS}/x"},
                "pool": "swarm",
                "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
                "enrollmentDigest": enrollment.digest(SECRET),
            }
        )
        api.post(f"{GV}/machines", machines.manifest(f"day0-swarm-{i:03d}", spec))

    async def boot_all() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
            return await asyncio.gather(
                *(
                    http.get(
                        f"/cloud-init/{mac}/user-data", headers={"X-Gpufleet-Enrollment": SECRET}
                    )
                    for mac in macs
                )
            )

    answers = asyncio.run(boot_all())
    assert [r.status_code for r in answers] == [200] * 100
    tokens = {token_of(r.text) for r in answers}
    assert len(tokens) == 100
    secrets = api.get(
        "/api/v1/namespaces/kube-system/secrets?labelSelector=" + well_known.LABEL_MACHINE
    )["items"]
    owners = {s["metadata"]["labels"][well_known.LABEL_MACHINE] for s in secrets}
    assert {f"day0-swarm-{i:03d}" for i in range(100)} <= owners


def test_render_shows_what_a_machine_would_get_without_issuing(env: Any) -> None:
    info, api, _url, _tmp = env
    before = len(api.get("/api/v1/namespaces/kube-system/secrets")["items"])
    done = gpufleet(
        "provision", "render", "--mac", "aa:00:00:00:03:01", "--kubeconfig", str(info.kubeconfig)
    )
    assert done.returncode == 0, done.stderr
    assert "#!ipxe" in done.stdout and "<token-id>.<token-secret>" in done.stdout
    assert len(api.get("/api/v1/namespaces/kube-system/secrets")["items"]) == before
    unknown = gpufleet(
        "provision", "render", "--mac", "de:ad:be:ef:00:09", "--kubeconfig", str(info.kubeconfig)
    )
    # No such object: exit 2, as for any object the apiserver does not hold (docs/cli.md).
    assert unknown.returncode == 2 and "would get 404" in unknown.stderr


def test_the_ca_hash_is_kubeadms(env: Any) -> None:
    info, *_ = env
    pem = Path(info.ca_file).read_bytes()
    blocks = pem.decode().split("-----END CERTIFICATE-----")
    ca = blocks[-2].strip() + "\n-----END CERTIFICATE-----\n"
    pub = subprocess.run(
        ["openssl", "x509", "-pubkey", "-noout"], input=ca.encode(), capture_output=True, check=True
    ).stdout
    der = subprocess.run(
        ["openssl", "pkey", "-pubin", "-outform", "der"], input=pub, capture_output=True, check=True
    ).stdout
    import hashlib

    assert render.ca_hash(pem) == "sha256:" + hashlib.sha256(der).hexdigest()


def test_refused_is_fail_closed_for_a_machine_without_credentials(env: Any) -> None:
    info, *_ = env

    async def ask() -> Refused:
        kube = await KubeApi.connect(str(info.kubeconfig))
        config = boot_config(ServeOptions(kubeconfig=info.kubeconfig))
        prov = Provisioner(kube, config)
        try:
            # serial presented, BMC unreachable (port 1): refused, not served
            await prov.user_data("aa:00:00:00:03:01", client="t", serial="SN-exp")
        except Refused as exc:
            await prov.drain_events()
            return exc
        raise AssertionError("served without a working BMC")

    assert asyncio.run(ask()).status == 403


def test_a_machine_reimaged_to_a_version_boots_that_version_or_nothing(env: Any) -> None:
    info, api, _url, _tmp = env
    mac = "aa:00:00:00:03:0a"
    spec = machines.MachineSpec.model_validate(
        {
            "macs": [mac],
            "serial": "SN-versioned",
            "bmc": {"endpoint": "http://127.0.0.1:1", "credentialsSecret": f"{SYSTEM_NS}/none"},
            "pool": "train",
            "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
        }
    )
    api.post(f"{GV}/machines", machines.manifest("day0-versioned", spec))
    # What the controller's reimage for a MaintenancePlan with spec.image v2 writes.
    api.patch(
        f"{GV}/machines/day0-versioned/status",
        {"status": {"image": "v2", "armed": True}},
        kind="merge",
    )

    async def script(images_url: str) -> str | Refused:
        kube = await KubeApi.connect(str(info.kubeconfig))
        config = boot_config(ServeOptions(kubeconfig=info.kubeconfig, images_url=images_url))
        prov = Provisioner(kube, config)
        try:
            return await prov.ipxe(mac, client="t")
        except Refused as exc:
            return exc
        finally:
            await prov.drain_events()

    served = asyncio.run(script("http://10.0.0.2/images/"))
    assert isinstance(served, str)
    assert "kernel http://10.0.0.2/images/v2/vmlinuz " in served
    assert "initrd http://10.0.0.2/images/v2/initrd.img" in served
    assert "fetch=http://10.0.0.2/images/v2/rootfs.squashfs" in served
    # A service that serves only its default image does not boot it with another one.
    refused = asyncio.run(script(""))
    assert isinstance(refused, Refused) and refused.status == 409
    assert "v2" in str(refused)
    wait_for("the audit Event", lambda: "ImageNotServed" in audit_reasons(api, "day0-versioned"))
