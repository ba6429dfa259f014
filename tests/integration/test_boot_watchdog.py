"""A machine powered on to join either joins, is retried, or fails with the stage named.

Real apiserver, the real provisioning service (what a booting machine asks for is
asked over HTTP, as in test_provision_join), the lifecycle controller as a process,
``gpufleet machines power-on`` as an operator runs it, and a Redfish BMC emulator of
this module's own (its power cycles touch no other test's node). Faults made on
purpose: a machine that never network-boots, one whose image never reaches
cloud-init, one whose join never completes, and a BMC that refuses the retry.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from controller_harness import (
    GV,
    SYSTEM_NS,
    Api,
    free_port,
    install,
    policy_spec,
    put_bmc_secret,
    put_policy,
    running,
    wait_for,
)

from gpufleet.domain import enrollment
from gpufleet.local import redfish
from gpufleet.provision import machines
from gpufleet.provision.issuer import ServiceSettings
from gpufleet.provision.server import ServeOptions, in_thread

pytestmark = pytest.mark.integration

POLICY = "boot-watch"
STALL = 6
ATTEMPTS = 3
SECRET = "boot-watch-secret"
USER, PASSWORD = "admin", "boot-watch-pw"
NAMES = ("boot-silent", "boot-stages", "boot-refused")


@pytest.fixture(scope="module")
def env(local_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    api = Api(local_cluster)
    install(api)
    spec = policy_spec()
    spec["provisioning"] = {"stallSeconds": STALL, "bootAttempts": ATTEMPTS}
    put_policy(api, POLICY, spec)
    ports = {name: free_port() for name in NAMES}
    servers = redfish.serve(
        {
            "user": USER,
            "password": PASSWORD,
            "bmcs": [{"node": name, "port": port} for name, port in ports.items()],
        }
    )
    logs = tmp_path_factory.mktemp("boot-watch-logs")
    options = ServeOptions(kubeconfig=local_cluster.kubeconfig, port=free_port())
    try:
        for i, name in enumerate(NAMES):
            add_machine(api, name, f"aa:00:00:00:0b:{i:02x}", f"http://127.0.0.1:{ports[name]}")
        with (
            in_thread(options, ServiceSettings()) as url,
            running(local_cluster, logs, policy=POLICY) as ctl,
        ):
            yield local_cluster, api, url, ports, ctl
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
        for name in NAMES:
            api.delete(f"{GV}/machines/{name}")
            api.delete(f"/api/v1/namespaces/{SYSTEM_NS}/secrets/bmc-{name}")
        api.delete(f"{GV}/fleetpolicies/{POLICY}")


def add_machine(api: Api, name: str, mac: str, endpoint: str) -> None:
    secret = put_bmc_secret(api, name, endpoint, USER, PASSWORD)
    spec = machines.MachineSpec.model_validate(
        {
            "macs": [mac],
            "serial": f"SN-{name}",  # what the emulator reports for this BMC
            "bmc": {"endpoint": endpoint, "credentialsSecret": secret},
            "pool": POLICY,
            "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
            "enrollmentDigest": enrollment.digest(SECRET),
        }
    )
    api.post(f"{GV}/machines", machines.manifest(name, spec))


def power_on(info: Any, *names: str) -> subprocess.CompletedProcess[str]:
    """``gpufleet machines power-on`` as an operator runs it."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "gpufleet.cli.main", "machines", "power-on"),
            *names,
            *("--kubeconfig", str(info.kubeconfig)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def counters(port: int) -> dict[str, Any]:
    data = httpx.get(
        f"http://127.0.0.1:{port}/redfish/v1/Systems/1", auth=(USER, PASSWORD), timeout=5
    ).json()
    return {**data["Oem"]["Gpufleet"], "Boot": data["Boot"]}


def boot_of(api: Api, name: str) -> dict[str, Any]:
    status: dict[str, Any] = api.get(f"{GV}/machines/{name}").get("status") or {}
    return status


def machine_events(api: Api, name: str) -> list[str]:
    items = api.get(
        f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{name}"
    )["items"]
    return [e["reason"] for e in items if e["involvedObject"].get("kind") == "Machine"]


def test_a_machine_that_never_network_boots_is_power_cycled_then_failed(env: Any) -> None:
    info, api, _url, ports, ctl = env
    name = "boot-silent"
    done = power_on(info, name)
    assert done.returncode == 0, done.stderr
    assert counters(ports[name])["ResetCount"] == 1
    boot = boot_of(api, name)["boot"]
    assert boot["outcome"] == "InProgress" and boot["attempt"] == 1

    # Nothing asks for an iPXE script: each stall is one power cycle, then the boot fails.
    wait_for(
        "the boot failed",
        lambda: boot_of(api, name).get("boot", {}).get("outcome") == "Failed",
        timeout=90,
    )
    status = boot_of(api, name)
    assert status["phase"] == "Failed"
    assert status["boot"]["reason"] == "NoNetworkBoot" and status["boot"]["attempt"] == ATTEMPTS
    booted = [c for c in status["conditions"] if c["type"] == "Booted"]
    assert booted and booted[0]["status"] == "False" and booted[0]["reason"] == "NoNetworkBoot"
    bmc = counters(ports[name])
    assert bmc["ResetCount"] == ATTEMPTS  # one power action per attempt, none after
    wait_for("the Events", lambda: "BootFailed" in machine_events(api, name), timeout=30)
    reasons = machine_events(api, name)
    assert reasons.count("BootRetried") == ATTEMPTS - 1
    # Failed stays failed: nothing loops. The watchdog passes with the tick; after ten
    # more, still one power action per attempt and the boot still failed.
    ctl.wait_ticks(10)
    assert counters(ports[name])["ResetCount"] == ATTEMPTS
    assert boot_of(api, name)["boot"]["outcome"] == "Failed"


def test_the_stall_names_the_stage_and_a_retry_revokes_the_token(env: Any) -> None:
    info, api, url, ports, _ctl = env
    name, mac = "boot-stages", "aa:00:00:00:0b:01"
    assert power_on(info, name).returncode == 0
    # The firmware reaches the service, but the image never asks for its user-data.
    assert httpx.get(f"{url}/ipxe", params={"mac": mac}, timeout=10).status_code == 200
    wait_for(
        "the image stall retried",
        lambda: boot_of(api, name)["boot"].get("attempt") == 2,
        timeout=60,
    )
    assert "ImageDidNotBoot" in boot_of(api, name)["boot"]["message"]
    # Attempt 2 gets as far as its join token, and no Node ever comes.
    assert httpx.get(f"{url}/ipxe", params={"mac": mac}, timeout=10).status_code == 200
    got = httpx.get(
        f"{url}/cloud-init/{mac}/user-data", headers={"X-Gpufleet-Enrollment": SECRET}, timeout=10
    )
    assert got.status_code == 200, got.text
    token_id = boot_of(api, name)["tokenId"]
    secret = f"/api/v1/namespaces/kube-system/secrets/{enrollment.secret_name(token_id)}"
    assert api.http.get(secret).status_code == 200
    wait_for(
        "the join stall retried",
        lambda: boot_of(api, name)["boot"].get("attempt") == 3,
        timeout=60,
    )
    status = boot_of(api, name)
    assert "JoinDidNotComplete" in status["boot"]["message"]
    # The retry re-armed the machine: the unused token of the stalled join is revoked.
    assert status["armed"] is True
    assert api.http.get(secret).status_code == 404
    assert counters(ports[name])["LastBootSource"] == "Pxe"  # the retries booted from the network


def test_a_retry_the_bmc_refuses_still_uses_up_its_attempt(env: Any) -> None:
    info, api, _url, ports, _ctl = env
    name = "boot-refused"
    assert power_on(info, name).returncode == 0
    url = f"http://127.0.0.1:{ports[name]}/gpufleet/control"
    r = httpx.patch(url, json={"refuse": 100}, auth=(USER, PASSWORD), timeout=5)
    assert r.status_code == 200
    wait_for(
        "the boot failed",
        lambda: boot_of(api, name).get("boot", {}).get("outcome") == "Failed",
        timeout=90,
    )
    bmc = counters(ports[name])
    assert bmc["ResetCount"] == 1  # only the operator's power-on happened
    assert bmc["ResetPosts"] == ATTEMPTS  # each retry was one POST, refused, never repeated
    wait_for("the Events", lambda: "BootRetryFailed" in machine_events(api, name), timeout=30)


def test_power_on_refuses_a_bmc_that_is_not_the_machines(env: Any) -> None:
    info, api, _url, ports, _ctl = env
    name = "boot-mismatch"
    add_machine(api, name, "aa:00:00:00:0b:7f", f"http://127.0.0.1:{ports['boot-stages']}")
    try:
        before = counters(ports["boot-stages"])["ResetPosts"]
        done = power_on(info, name)
        assert done.returncode != 0
        assert "not verified" in done.stderr and "SN-boot-stages" in done.stderr
        assert counters(ports["boot-stages"])["ResetPosts"] == before
        assert "boot" not in boot_of(api, name)  # nothing recorded either
    finally:
        api.delete(f"{GV}/machines/{name}")
        api.delete(f"/api/v1/namespaces/{SYSTEM_NS}/secrets/bmc-{name}")
