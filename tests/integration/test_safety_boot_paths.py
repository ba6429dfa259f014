"""Machine boot paths trust the Secret, not the Machine (issue 33, defect 4), live.

Real apiserver, the real provisioning service over HTTP, ``gpufleet machines power-on``
as an operator runs it, the lifecycle controller as a process (its boot watchdog), a
Redfish emulator of this module's own, and a trap: an HTTP server that records every
request it gets, standing where a forged Machine says its BMC is. Broken on purpose:

- a Machine names another machine's BMC Secret and the trap as its endpoint: neither
  the power-on nor the provisioning service's serial check may send the credentials
  there (or anywhere), nor power the other machine;
- an unauthenticated ``GET /ipxe`` for a Machine nobody powered on: served, but the
  watchdog must never power-cycle it (while it does retry a boot gpufleet requested);
- one MAC spelled four ways: one rate-limit bucket.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
)
from waiting import wait_for

from gpufleet.domain import enrollment
from gpufleet.local import redfish
from gpufleet.provision import machines
from gpufleet.provision.issuer import ServiceSettings
from gpufleet.provision.server import ServeOptions, in_thread

pytestmark = pytest.mark.integration

POLICY = "safety-boot"
STALL = 5
USER, PASSWORD = "admin", "safety-boot-pw"
VICTIM, THIEF, QUIET = "safety-victim", "safety-thief", "safety-quiet"
MACS = {VICTIM: "aa:00:00:00:0c:01", THIEF: "aa:00:00:00:0c:02", QUIET: "aa:00:00:00:0c:03"}


class Trap:
    """An HTTP server that records every request (path and Authorization) and answers 401."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _any(self) -> None:
                seen.append((self.path, self.headers.get("Authorization", "")))
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_PATCH = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def env(local_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    api = Api(local_cluster)
    install(api)
    spec = policy_spec()
    spec["provisioning"] = {"stallSeconds": STALL, "bootAttempts": 3}
    put_policy(api, POLICY, spec)
    ports = {VICTIM: free_port(), QUIET: free_port()}
    servers = redfish.serve(
        {
            "user": USER,
            "password": PASSWORD,
            "bmcs": [{"node": name, "port": port} for name, port in ports.items()],
        }
    )
    trap = Trap()
    bmc = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    victim_secret = put_bmc_secret(api, VICTIM, bmc[VICTIM], USER, PASSWORD)
    add_machine(api, VICTIM, bmc[VICTIM], victim_secret)
    add_machine(api, THIEF, trap.url, victim_secret)  # the other's Secret, its own endpoint
    add_machine(api, QUIET, bmc[QUIET], put_bmc_secret(api, QUIET, bmc[QUIET], USER, PASSWORD))
    logs = tmp_path_factory.mktemp("safety-boot-logs")
    options = ServeOptions(kubeconfig=local_cluster.kubeconfig, port=free_port())
    # The controller manages no Node here (an empty selector match): only its boot watchdog
    # is in play, and the shared cluster's nodes are left alone.
    selector = ("--node-selector", "gpufleet.io/pool=safety-boot-no-node")
    try:
        with (
            in_thread(options, ServiceSettings()) as url,
            running(local_cluster, logs, policy=POLICY, extra_args=selector) as ctl,
        ):
            yield local_cluster, api, url, ports, trap, ctl
    finally:
        trap.close()
        for server in servers:
            server.shutdown()
            server.server_close()
        for name in MACS:
            api.delete(f"{GV}/machines/{name}")
        for name in (VICTIM, QUIET):
            api.delete(f"/api/v1/namespaces/{SYSTEM_NS}/secrets/bmc-{name}")
        api.delete(f"{GV}/fleetpolicies/{POLICY}")


def add_machine(api: Api, name: str, endpoint: str, secret: str) -> None:
    spec = machines.MachineSpec.model_validate(
        {
            "macs": [MACS[name]],
            "serial": f"SN-{name}",  # what the emulator reports for the BMC of that name
            "bmc": {"endpoint": endpoint, "credentialsSecret": secret},
            "pool": POLICY,
            "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
            "enrollmentDigest": enrollment.digest(f"enrol-{name}"),
        }
    )
    api.post(f"{GV}/machines", machines.manifest(name, spec))


def power_on(info: Any, name: str) -> subprocess.CompletedProcess[str]:
    """``gpufleet machines power-on`` as an operator runs it."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "gpufleet.cli.main", "machines", "power-on", name),
            *("--kubeconfig", str(info.kubeconfig)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def bmc(port: int) -> dict[str, Any]:
    data = httpx.get(
        f"http://127.0.0.1:{port}/redfish/v1/Systems/1", auth=(USER, PASSWORD), timeout=5
    ).json()
    counters: dict[str, Any] = data["Oem"]["Gpufleet"]
    return counters


def status_of(api: Api, name: str) -> dict[str, Any]:
    status: dict[str, Any] = api.get(f"{GV}/machines/{name}").get("status") or {}
    return status


def machine_events(api: Api, name: str) -> list[str]:
    items = api.get(
        f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{name}"
    )["items"]
    return [e["reason"] for e in items if e["involvedObject"].get("kind") == "Machine"]


def test_a_machine_naming_another_machines_secret_gets_neither_credentials_nor_power(
    env: Any,
) -> None:
    info, api, url, ports, trap, _ctl = env
    before = bmc(ports[VICTIM])
    done = power_on(info, THIEF)
    assert done.returncode != 0
    assert "holds the credentials of" in done.stderr and trap.url in done.stderr, done.stderr
    # The serial check of the provisioning service, asked for the thief's MAC.
    got = httpx.get(
        f"{url}/cloud-init/{MACS[THIEF]}/user-data",
        headers={"X-Gpufleet-Serial": f"SN-{THIEF}"},
        timeout=10,
    )
    assert got.status_code == 403
    wait_for(
        "the refusals as Events",
        lambda: {"BmcEndpointMismatch", "TokenRefused"} <= set(machine_events(api, THIEF)),
        timeout=30,
    )
    assert trap.requests == []  # the victim's credentials went nowhere
    after = bmc(ports[VICTIM])
    assert after["ResetPosts"] == before["ResetPosts"]  # the victim was not powered
    status = status_of(api, THIEF)
    assert "boot" not in status and "tokenId" not in status  # nothing recorded, no token


def test_an_ipxe_request_nobody_asked_for_never_makes_the_watchdog_act(env: Any) -> None:
    info, api, url, ports, _trap, ctl = env
    spelled = MACS[QUIET].upper().replace(":", "-")
    got = httpx.get(f"{url}/ipxe", params={"mac": spelled}, timeout=10)
    assert got.status_code == 200 and got.text.startswith("#!ipxe")
    assert "boot" not in status_of(api, QUIET)
    wait_for(
        "UnrequestedNetworkBoot", lambda: "UnrequestedNetworkBoot" in machine_events(api, QUIET)
    )
    # Past the stall time, the watchdog has passed many times and never acted.
    time.sleep(STALL + 1)
    ctl.wait_ticks(5)
    assert bmc(ports[QUIET])["ResetPosts"] == 0
    assert not {"BootStalled", "BootRetried"} & set(machine_events(api, QUIET))

    # The same watchdog does act on a boot gpufleet requested (so the silence above
    # is its rule, not its absence): powered on, iPXE served, the image never asks.
    assert power_on(info, QUIET).returncode == 0
    assert httpx.get(f"{url}/ipxe", params={"mac": spelled}, timeout=10).status_code == 200
    assert status_of(api, QUIET)["boot"].get("networkBootAt")
    wait_for(
        "the requested boot retried",
        lambda: status_of(api, QUIET)["boot"].get("attempt") == 2,
        timeout=60,
    )
    # The attempt is recorded before its POST (at most once across a crash), so the
    # second POST follows the record by a moment.
    wait_for("the retry's POST", lambda: bmc(ports[QUIET])["ResetPosts"] == 2, timeout=30)


def test_one_mac_spelled_four_ways_has_one_rate_limit(env: Any) -> None:
    _info, _api, url, _ports, _trap, _ctl = env
    hexes = MACS[QUIET].replace(":", "")
    spellings = [
        MACS[QUIET],
        MACS[QUIET].upper().replace(":", "-"),
        f"{hexes[0:4]}.{hexes[4:8]}.{hexes[8:12]}",
        hexes.upper(),
    ]
    codes = [
        httpx.get(f"{url}/cloud-init/{mac}/meta-data", timeout=10).status_code
        for _ in range(5)
        for mac in spellings
    ]
    # Five requests per spelling, 20 in all: four buckets would answer every one; the one
    # bucket (burst 10, 1/s) answers 429 well before the end.
    assert codes.count(429) > 0, codes
    assert set(codes) <= {200, 429}
