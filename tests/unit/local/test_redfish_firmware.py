"""What real BMC firmware does that the emulator now does too (issue 33, defect 9): a
graceful reset that waits for the OS, reset types a system does not allow, a Reset
answered with a Task, transitional power states. Through HTTP where the answer matters,
with the project's own Redfish client. Live: tests/integration/test_safety_redfish.py."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gpufleet.local import redfish
from gpufleet.remediate import redfish as client

USER, PASSWORD = "admin", "pw"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def bmc() -> Iterator[Callable[..., tuple[str, redfish.BmcState]]]:
    servers: list[Any] = []

    def start(**entry: Any) -> tuple[str, redfish.BmcState]:
        port = _port()
        servers.extend(
            redfish.serve(
                {
                    "user": USER,
                    "password": PASSWORD,
                    "bmcs": [{"node": "n1", "port": port, **entry}],
                }
            )
        )
        return f"http://127.0.0.1:{port}", servers[-1].bmc

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def system(url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(
        f"{url}/redfish/v1/Systems/1", auth=(USER, PASSWORD), timeout=5
    ).json()
    return data


def post(url: str, reset_type: str) -> httpx.Response:
    return httpx.post(
        f"{url}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
        json={"ResetType": reset_type},
        auth=(USER, PASSWORD),
        timeout=5,
    )


def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_graceful_restart_resets_only_once_the_os_has_shut_down(bmc: Any) -> None:
    url, state = bmc(os_shutdown_seconds=0.5)
    before = system(url)
    assert post(url, "GracefulRestart").status_code == 204
    during = system(url)
    # Accepted and under way, but the machine has not reset yet: the OS is shutting down.
    assert during["PowerState"] == "On"
    assert during["LastResetTime"] == before["LastResetTime"]
    assert during["Oem"]["Gpufleet"]["ResetCount"] == 1
    assert during["Oem"]["Gpufleet"]["BootCount"] == 0
    until(lambda: system(url)["LastResetTime"] != before["LastResetTime"])
    after = system(url)
    assert after["PowerState"] == "On" and after["Oem"]["Gpufleet"]["BootCount"] == 1
    ids = [e["MessageId"].rsplit(".", 1)[1] for e in state.log]
    assert ids == ["ResetRequested", "OsShutdownStarted", "PowerOff", "SystemBooted"]


def test_a_second_graceful_request_joins_the_shutdown_a_forced_one_cuts_it_short(
    bmc: Any,
) -> None:
    url, _ = bmc(os_shutdown_seconds=0.4)
    assert post(url, "GracefulRestart").status_code == 204
    assert post(url, "GracefulRestart").status_code == 204  # e.g. after a lost answer
    until(lambda: system(url)["Oem"]["Gpufleet"]["BootCount"] == 1)
    time.sleep(0.5)
    done = system(url)["Oem"]["Gpufleet"]
    assert (done["ResetPosts"], done["ResetCount"], done["GracefulJoined"]) == (2, 1, 1)
    assert done["BootCount"] == 1  # one reset for the two requests

    url, _ = bmc(os_shutdown_seconds=0.4)
    assert post(url, "GracefulShutdown").status_code == 204
    assert post(url, "ForceRestart").status_code == 204
    time.sleep(0.6)  # past the shutdown the forced reset overrode
    got = system(url)
    assert got["PowerState"] == "On" and got["Oem"]["Gpufleet"]["BootCount"] == 1


def test_a_hung_os_never_acts_on_a_graceful_request(bmc: Any) -> None:
    url, _state = bmc(os_shutdown_seconds=0.1)
    control = f"{url}/gpufleet/control"
    assert httpx.patch(control, json={"osIgnoresShutdown": True}, auth=(USER, PASSWORD)).is_success
    before = system(url)
    assert post(url, "GracefulRestart").status_code == 204
    time.sleep(0.4)
    after = system(url)
    assert after["LastResetTime"] == before["LastResetTime"] and after["PowerState"] == "On"
    assert after["Oem"]["Gpufleet"]["ResetPosts"] == 1
    assert after["Oem"]["Gpufleet"]["ResetCount"] == 0


def test_a_system_refuses_the_reset_types_it_does_not_list(bmc: Any) -> None:
    types = ["On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi"]
    url, state = bmc(reset_types=types)
    action = system(url)["Actions"]["#ComputerSystem.Reset"]
    assert action["ResetType@Redfish.AllowableValues"] == types
    refused = post(url, "PowerCycle")
    assert refused.status_code == 400
    assert "ActionParameterNotSupported" in refused.json()["error"]["code"]
    assert state.reset_count == 0 and state.boot_count == 0

    async def allows() -> tuple[bool, bool]:
        creds = client.BmcCredentials(url, USER, PASSWORD)
        async with client.RedfishClient(creds, name="n1") as c:
            await c.system()
            return c.allows("PowerCycle"), c.allows("ForceRestart")

    assert asyncio.run(allows()) == (False, True)  # what the remediation driver learns


def test_a_reset_answered_with_a_task_completes_when_the_reset_is_performed(bmc: Any) -> None:
    url, _state = bmc(os_shutdown_seconds=0.4, task_reset=True)
    answer = post(url, "GracefulRestart")
    assert answer.status_code == 202
    location = answer.headers["Location"]
    assert location.startswith("/redfish/v1/TaskService/Tasks/")
    assert answer.json()["TaskState"] == "Running"
    task = httpx.get(f"{url}{location}", auth=(USER, PASSWORD)).json()
    assert task["TaskState"] == "Running"
    until(
        lambda: (
            httpx.get(f"{url}{location}", auth=(USER, PASSWORD)).json()["TaskState"] == "Completed"
        )
    )
    assert system(url)["Oem"]["Gpufleet"]["BootCount"] == 1
    # An immediate reset's Task is complete when it is answered.
    forced = post(url, "ForceRestart")
    assert forced.status_code == 202 and forced.json()["TaskState"] == "Completed"


def test_transitional_power_states_while_the_os_shuts_down_and_the_system_boots(
    bmc: Any,
) -> None:
    url, _state = bmc(os_shutdown_seconds=0.4, boot_seconds=0.4, power_transitions=True)
    assert post(url, "GracefulRestart").status_code == 204
    assert system(url)["PowerState"] == "PoweringOff"
    until(lambda: system(url)["PowerState"] == "PoweringOn")
    until(lambda: system(url)["PowerState"] == "On")
    assert system(url)["Oem"]["Gpufleet"]["BootCount"] == 1


def test_the_control_endpoint_sets_the_firmware_behaviours_and_refuses_nonsense(
    bmc: Any,
) -> None:
    url, state = bmc()
    assert state.os_shutdown_seconds == redfish.DEFAULT_OS_SHUTDOWN_S
    control = f"{url}/gpufleet/control"
    auth = (USER, PASSWORD)
    body = {"osShutdownSeconds": 30, "resetTypes": ["On", "ForceOff"], "taskReset": True}
    got = httpx.patch(control, json=body, auth=auth).json()
    assert got["osShutdownSeconds"] == 30 and got["resetTypes"] == ["On", "ForceOff"]
    assert got["taskReset"] is True and got["powerTransitions"] is False
    for bad in ({"osShutdownSeconds": -1}, {"resetTypes": ["Reboot"]}, {"taskReset": "yes"}):
        assert httpx.patch(control, json=bad, auth=auth).status_code == 400
    assert state.os_shutdown_seconds == 30.0  # nothing set by the refused ones
