"""The local cluster's Redfish BMCs behave as real firmware does where remediation must
cope with it (issue 33, defect 9, emulator side), live: the cluster's own emulator
process, over HTTP, switched per system through its control endpoint and put back.

Broken on purpose: an OS that takes 12 s to shut down after a GracefulRestart (longer
than the controller's 10 s settle window), an OS that never acts on the request, a
system that does not list PowerCycle, a BMC that answers a Reset with a Task.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from waiting import wait_for

from gpufleet.local import redfish

pytestmark = pytest.mark.integration

SLOW_OS_S = 12.0
SETTLE_S = 10.0
"""The controller's settle window for a lost answer before issue 33 (remediate.steps)."""


class Bmc:
    """One node's BMC of the local cluster, as a client sees it."""

    def __init__(self, info: Any, node: str) -> None:
        endpoint = info.bmcs[node]
        self.url = endpoint.url
        self.auth = (endpoint.user, endpoint.password)

    def system(self) -> dict[str, Any]:
        got: dict[str, Any] = httpx.get(
            f"{self.url}/redfish/v1/Systems/1", auth=self.auth, timeout=5
        ).json()
        return got

    def reset(self, reset_type: str) -> httpx.Response:
        return httpx.post(
            f"{self.url}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            json={"ResetType": reset_type},
            auth=self.auth,
            timeout=5,
        )

    def control(self, **switches: Any) -> dict[str, Any]:
        r = httpx.patch(f"{self.url}/gpufleet/control", json=switches, auth=self.auth, timeout=5)
        assert r.status_code == 200, r.text
        got: dict[str, Any] = r.json()
        return got


@pytest.fixture
def bmc(local_cluster: Any) -> Iterator[Bmc]:
    """The last node's BMC; every firmware switch put back afterwards, the system on."""
    node = local_cluster.node_names[-1]
    b = Bmc(local_cluster, node)
    before = b.control()
    yield b
    b.control(
        osShutdownSeconds=before["osShutdownSeconds"],
        resetTypes=before["resetTypes"],
        taskReset=before["taskReset"],
        powerTransitions=before["powerTransitions"],
        osIgnoresShutdown=False,
    )
    wait_for("the system on again", lambda: b.system()["PowerState"] == "On", timeout=30)


def test_a_graceful_restart_moves_last_reset_time_only_once_the_os_is_down(bmc: Bmc) -> None:
    assert bmc.control()["osShutdownSeconds"] == redfish.DEFAULT_OS_SHUTDOWN_S  # realistic
    bmc.control(osShutdownSeconds=SLOW_OS_S, powerTransitions=True)
    before = bmc.system()
    posted = time.monotonic()
    assert bmc.reset("GracefulRestart").status_code == 204
    # Through the whole settle window the reset is under way but not visible as one:
    # LastResetTime unchanged, the power on (PoweringOff: the OS is shutting down).
    seen = []
    while time.monotonic() - posted < SETTLE_S:
        now = bmc.system()
        seen.append((now["LastResetTime"], now["PowerState"]))
        time.sleep(0.5)
    assert {t for t, _ in seen} == {before["LastResetTime"]}
    assert {p for _, p in seen} == {"PoweringOff"}
    assert (
        bmc.system()["Oem"]["Gpufleet"]["ResetCount"] == before["Oem"]["Gpufleet"]["ResetCount"] + 1
    )
    # A second request in that window (after a lost answer, or a restarted controller)
    # joins the one under way: still one reset.
    assert bmc.reset("GracefulRestart").status_code == 204
    wait_for(
        "LastResetTime to move",
        lambda: bmc.system()["LastResetTime"] != before["LastResetTime"],
        timeout=SLOW_OS_S + 5,
    )
    wait_for("on again", lambda: bmc.system()["PowerState"] == "On", timeout=10)
    after = bmc.system()["Oem"]["Gpufleet"]
    assert after["BootCount"] == before["Oem"]["Gpufleet"]["BootCount"] + 1
    assert after["GracefulJoined"] == before["Oem"]["Gpufleet"]["GracefulJoined"] + 1


def test_an_os_that_never_shuts_down_leaves_the_request_answered_and_unperformed(
    bmc: Bmc,
) -> None:
    bmc.control(osShutdownSeconds=1.0, osIgnoresShutdown=True)
    before = bmc.system()
    assert bmc.reset("GracefulRestart").status_code == 204
    time.sleep(3)  # three shutdown times
    after = bmc.system()
    assert after["LastResetTime"] == before["LastResetTime"] and after["PowerState"] == "On"
    assert after["Oem"]["Gpufleet"]["ResetPosts"] == before["Oem"]["Gpufleet"]["ResetPosts"] + 1
    assert after["Oem"]["Gpufleet"]["BootCount"] == before["Oem"]["Gpufleet"]["BootCount"]


def test_a_system_without_power_cycle_and_a_reset_answered_with_a_task(bmc: Bmc) -> None:
    listed = [
        "On",
        "ForceOff",
        "GracefulShutdown",
        "GracefulRestart",
        "ForceRestart",
        "Nmi",
        "ForceOn",
    ]
    bmc.control(resetTypes=listed, taskReset=True, osShutdownSeconds=2.0)
    action = bmc.system()["Actions"]["#ComputerSystem.Reset"]
    assert action["ResetType@Redfish.AllowableValues"] == listed
    info = httpx.get(f"{bmc.url}{action['@Redfish.ActionInfo']}", auth=bmc.auth, timeout=5).json()
    assert info["Parameters"][0]["AllowableValues"] == listed
    before = bmc.system()["Oem"]["Gpufleet"]
    refused = bmc.reset("PowerCycle")
    assert refused.status_code == 400 and "ActionParameterNotSupported" in refused.text
    assert bmc.system()["Oem"]["Gpufleet"]["ResetCount"] == before["ResetCount"]  # nothing done
    answer = bmc.reset("GracefulRestart")
    assert answer.status_code == 202 and answer.json()["TaskState"] == "Running"
    task = f"{bmc.url}{answer.headers['Location']}"
    wait_for(
        "the Task completed with the reset",
        lambda: httpx.get(task, auth=bmc.auth, timeout=5).json()["TaskState"] == "Completed",
        timeout=10,
    )
    assert bmc.system()["Oem"]["Gpufleet"]["BootCount"] == before["BootCount"] + 1
