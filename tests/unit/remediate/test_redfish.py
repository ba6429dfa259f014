"""The Redfish client against the project's BMC emulator (real HTTP on loopback)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from gpufleet.domain.ladder import Step
from gpufleet.local import redfish as emulator
from gpufleet.remediate import redfish, steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def bmc() -> Iterator[tuple[emulator.BmcState, redfish.BmcCredentials]]:
    port = _free_port()
    (server,) = emulator.serve(
        {"user": "admin", "password": "pw", "bmcs": [{"node": "n1", "port": port}]}
    )
    try:
        yield server.bmc, redfish.BmcCredentials(f"http://127.0.0.1:{port}", "admin", "pw")  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _step(creds: redfish.BmcCredentials, step: Step) -> str:
    async with redfish.RedfishClient(creds, name="n1", retry_delays=(0.05,)) as client:
        return await steps.run_bmc_step(step, client)


def test_power_cycle_uses_the_discovered_system(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    text = run(_step(creds, Step.POWER_CYCLE))
    assert "PowerCycle" in text and "n1" in text
    assert state.reset_count == 1 and state.last_reset_type == "PowerCycle"
    assert state.boot_count == 1


def test_power_cycle_falls_back_to_force_off_and_on(bmc, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    monkeypatch.setattr(
        emulator, "RESET_TYPES", tuple(t for t in emulator.RESET_TYPES if t != "PowerCycle")
    )
    text = run(_step(creds, Step.POWER_CYCLE))
    assert "ForceOff+On" in text
    assert [e["Message"].split()[-1] for e in state.log if "Reset" in e["MessageId"]] == [
        "ForceOff",
        "On",
    ]
    assert state.power_state == "On"


def test_reboot_is_a_graceful_restart(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    run(_step(creds, Step.REBOOT))
    assert state.last_reset_type == "GracefulRestart"


def test_reboot_falls_back_to_force_restart(bmc, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    monkeypatch.setattr(
        emulator, "RESET_TYPES", tuple(t for t in emulator.RESET_TYPES if t != "GracefulRestart")
    )
    run(_step(creds, Step.REBOOT))
    assert state.last_reset_type == "ForceRestart"


def test_reimage_boots_once_from_the_network(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    run(_step(creds, Step.REIMAGE))
    assert state.last_boot_source == "Pxe"
    assert state.boot_enabled == "Disabled"  # the override was consumed by that boot
    run(_step(creds, Step.POWER_CYCLE))
    assert state.last_boot_source == "Hdd"


def test_bad_credentials_name_the_bmc(bmc) -> None:  # type: ignore[no-untyped-def]
    _, creds = bmc
    wrong = redfish.BmcCredentials(creds.endpoint, "admin", "nope")
    with pytest.raises(redfish.BmcAuthError, match=r"n1 .*check the Secret"):
        run(_step(wrong, Step.REBOOT))


def test_unreachable_bmc_is_retried_a_bounded_number_of_times() -> None:
    creds = redfish.BmcCredentials(f"http://127.0.0.1:{_free_port()}", "a", "b")

    async def go() -> None:
        async with redfish.RedfishClient(
            creds, name="gone", retry_delays=(0.01, 0.01), timeout_s=1
        ) as client:
            await client.power_cycle()

    with pytest.raises(redfish.BmcUnreachable, match=r"gone .*after 3 attempts"):
        run(go())


def test_credentials_do_not_show_the_password() -> None:
    assert "secret" not in repr(redfish.BmcCredentials("http://x", "u", "secret"))
