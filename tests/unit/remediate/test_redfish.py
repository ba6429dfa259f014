"""The Redfish client and the BMC steps against the project's BMC emulator (real HTTP on
loopback), including BMCs that misbehave: one reset POST per attempt, whatever they answer."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from gpufleet.domain.ladder import Step
from gpufleet.local import redfish as emulator
from gpufleet.remediate import power, redfish, steps
from gpufleet.remediate.evidence import ActionMark, ResetEvidence
from gpufleet.remediate.identity import ExpectedIdentity


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def bmc() -> Iterator[tuple[emulator.BmcState, redfish.BmcCredentials]]:
    port = _free_port()
    # The OS takes 0.5 s to shut down after a graceful request: a real wait, well inside
    # the steps' 3 s graceful settle even on a loaded machine (the default 3 s raced it).
    bmcs = [{"node": "n1", "port": port, "os_shutdown_seconds": 0.5}]
    with emulator.serving({"user": "admin", "password": "pw", "bmcs": bmcs}) as (server,):
        yield server.bmc, redfish.BmcCredentials(f"http://127.0.0.1:{port}", "admin", "pw")  # type: ignore[attr-defined]


class Journal:
    """Keeps the write-ahead marks in memory; ``fail`` makes the write fail."""

    def __init__(self, fail: bool = False) -> None:
        self.marks: list[ActionMark] = []
        self.fail = fail

    async def write(self, mark: ActionMark) -> None:
        if self.fail:
            raise redfish.RedfishError("n1", "the mark could not be stored")
        self.marks.append(mark)


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


async def _step(
    creds: redfish.BmcCredentials,
    step: Step,
    *,
    journal: Journal | None = None,
    expected: ExpectedIdentity | None = None,
    mark: ActionMark | None = None,
    timeout_s: float = 5.0,
    settle_s: float = 1.0,
    graceful_settle_s: float = 3.0,
) -> str:
    async with power.RedfishPower(
        creds, name="n1", retry_delays=(0.05,), timeout_s=timeout_s
    ) as client:
        return await steps.run_bmc_step(
            step,
            client,
            attempt=steps.Attempt(step, 1, 1000.0),
            journal=journal or Journal(),
            expected=expected or ExpectedIdentity(node="n1"),
            mark=mark,
            settle_s=settle_s,
            graceful_settle_s=graceful_settle_s,
            poll_s=0.1,
        )


def test_power_cycle_uses_the_discovered_system_and_marks_before_posting(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    before = state.last_reset_time
    journal = Journal()
    text = run(_step(creds, Step.POWER_CYCLE, journal=journal))
    assert "PowerCycle" in text and "n1" in text
    assert state.reset_count == 1 and state.last_reset_type == "PowerCycle"
    assert state.boot_count == 1 and state.last_reset_time != before
    (mark,) = journal.marks
    assert (mark.step, mark.attempt, mark.reset_type) == ("power-cycle", 1, "PowerCycle")
    assert mark.baseline.last_reset_time == before  # read before the POST


def test_power_cycle_falls_back_to_force_off_and_on(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    state.reset_types = tuple(t for t in emulator.RESET_TYPES if t != "PowerCycle")
    journal = Journal()
    text = run(_step(creds, Step.POWER_CYCLE, journal=journal))
    assert "ForceOff + On" in text
    assert [e["Message"].split()[-1] for e in state.log if "Reset" in e["MessageId"]] == [
        "ForceOff",
        "On",
    ]
    assert [m.reset_type for m in journal.marks] == ["ForceOff", "On"]
    assert state.power_state == "On"


def test_reboot_is_a_graceful_restart(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    run(_step(creds, Step.REBOOT))
    assert state.last_reset_type == "GracefulRestart"


def test_reboot_falls_back_to_force_restart(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    state.reset_types = tuple(t for t in emulator.RESET_TYPES if t != "GracefulRestart")
    run(_step(creds, Step.REBOOT))
    assert state.last_reset_type == "ForceRestart"


def test_reimage_boots_once_from_the_network(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    run(_step(creds, Step.REIMAGE))
    assert state.last_boot_source == "Pxe"
    assert state.boot_enabled == "Disabled"  # the override was consumed by that boot
    run(_step(creds, Step.POWER_CYCLE))
    assert state.last_boot_source == "Hdd"


def _overrides_set(state: emulator.BmcState) -> int:
    return sum(e["MessageId"] == "Gpufleet.1.0.BootOverrideSet" for e in state.log)


def test_a_reboot_never_uses_a_network_boot_a_reimage_left_armed(bmc) -> None:  # type: ignore[no-untyped-def]
    """A reimage whose reset never came leaves its override armed through verification
    (decision 0177); the next reboot removes it before its reset and boots the disk."""
    state, creds = bmc

    async def arm() -> None:
        async with power.RedfishPower(creds, name="n1", retry_delays=(0.05,)) as client:
            await client.set_one_time_boot("Pxe")

    run(arm())
    assert state.boot_enabled == "Once" and state.boot_target == "Pxe"
    run(_step(creds, Step.REBOOT))
    assert state.last_reset_type == "GracefulRestart"
    assert state.last_boot_source == "Hdd"  # not a reimage
    assert state.boot_enabled == "Disabled"


def test_a_reboot_with_nothing_armed_writes_no_boot_override(bmc) -> None:  # type: ignore[no-untyped-def]
    """Read first: a BMC's log gets no entry beside the reset's (its evidence)."""
    state, creds = bmc
    run(_step(creds, Step.POWER_CYCLE))
    assert state.reset_posts == 1 and _overrides_set(state) == 0


def test_bad_credentials_name_the_bmc(bmc) -> None:  # type: ignore[no-untyped-def]
    _, creds = bmc
    wrong = redfish.BmcCredentials(creds.endpoint, "admin", "nope")
    with pytest.raises(redfish.BmcAuthError, match=r"n1 .*check the Secret"):
        run(_step(wrong, Step.REBOOT))


def test_unreachable_bmc_reads_are_retried_a_bounded_number_of_times() -> None:
    creds = redfish.BmcCredentials(f"http://127.0.0.1:{_free_port()}", "a", "b")

    async def go() -> None:
        async with redfish.RedfishClient(
            creds, name="gone", retry_delays=(0.01, 0.01), timeout_s=1
        ) as client:
            await client.identity()

    with pytest.raises(redfish.BmcUnreachable, match=r"gone .*after 3 attempts"):
        run(go())


def test_credentials_do_not_show_the_password() -> None:
    assert "secret" not in repr(redfish.BmcCredentials("http://x", "u", "secret"))


# ------------------------------------------------------------- misbehaving BMCs


def _switch(state: emulator.BmcState, **switches: Any) -> None:
    state.set_control(switches)


def test_a_reset_answered_500_is_posted_once_and_confirmed_by_last_reset_time(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    _switch(state, failAfterReset=1)
    text = run(_step(creds, Step.POWER_CYCLE))
    assert state.reset_posts == 1 and state.reset_count == 1
    assert "HTTP 500" in text and "shows the reset happened" in text


def test_a_reset_answered_too_late_is_posted_once(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    _switch(state, slowAnswers=1, slowAnswerSeconds=1.5)
    text = run(_step(creds, Step.POWER_CYCLE, timeout_s=0.5))
    assert state.reset_posts == 1 and state.reset_count == 1
    assert "Timeout" in text and "shows the reset happened" in text


def test_a_refused_reset_fails_the_step_without_a_second_post(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    _switch(state, refuse=1)
    with pytest.raises(steps.ResetNotPerformed, match=r"HTTP 503.*not posted again"):
        # A GracefulRestart is given its own (longer) settle time: the OS shuts down first.
        run(_step(creds, Step.REBOOT, settle_s=0.5, graceful_settle_s=1.0))
    assert state.reset_posts == 1 and state.reset_count == 0
    assert state.reset_posts_by_type == {"GracefulRestart": 1}  # no ForceRestart either


def test_without_last_reset_time_the_event_log_confirms_the_reset(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    _switch(state, reportLastResetTime=False, failAfterReset=1)
    text = run(_step(creds, Step.POWER_CYCLE))
    assert state.reset_posts == 1
    assert "shows the reset happened" in text


def test_when_nothing_can_tell_the_reset_counts_as_done_unconfirmed(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    _switch(state, reportLastResetTime=False, refuse=1)
    text = run(_step(creds, Step.POWER_CYCLE, settle_s=0.5))
    assert state.reset_posts == 1  # not posted again; verification judges the node
    assert "not confirmed" in text


def test_a_failed_mark_means_no_post(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    with pytest.raises(redfish.RedfishError, match="could not be stored"):
        run(_step(creds, Step.POWER_CYCLE, journal=Journal(fail=True)))
    assert state.reset_posts == 0


def test_a_bmc_that_is_not_the_nodes_gets_no_post(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    with pytest.raises(steps.BmcIdentityMismatch, match="HostName n1, not n2"):
        run(_step(creds, Step.POWER_CYCLE, expected=ExpectedIdentity(node="n2")))
    machine = ExpectedIdentity(node="n1", machine="m1", serial="SN-other")
    with pytest.raises(steps.BmcIdentityMismatch, match="SerialNumber SN-n1, Machine m1"):
        run(_step(creds, Step.REIMAGE, expected=machine))
    assert state.reset_posts == 0 and state.boot_enabled == "Disabled"


# ------------------------------------------------------------------ resuming


def _mark(state: emulator.BmcState, *, posted_at: float = 0.0) -> ActionMark:
    return ActionMark(
        step="power-cycle",
        attempt=1,
        started_at=1000.0,
        reset_type="PowerCycle",
        baseline=ResetEvidence(last_reset_time=state.last_reset_time, power_state="On"),
        posted_at=posted_at,
    )


def test_resumed_after_the_reset_happened_nothing_is_posted(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    mark = _mark(state)
    state.reset("PowerCycle")  # the POST the killed controller sent
    text = run(_step(creds, Step.POWER_CYCLE, mark=mark))
    assert state.reset_posts == 0 and state.reset_count == 1
    assert "controller restart" in text and "shows the reset happened" in text


def test_resumed_when_the_reset_never_happened_it_is_posted_once(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    text = run(_step(creds, Step.POWER_CYCLE, mark=_mark(state)))
    assert state.reset_posts == 1 and state.reset_count == 1
    assert "not performed then" in text


def test_a_mark_of_another_attempt_is_ignored(bmc) -> None:  # type: ignore[no-untyped-def]
    state, creds = bmc
    old = _mark(state)
    state.reset("PowerCycle")  # that earlier attempt's reset
    stale = ActionMark(
        old.step, old.attempt, 999.0, old.reset_type, old.baseline, old.posted_at
    )  # an earlier attempt
    run(_step(creds, Step.POWER_CYCLE, mark=stale))
    assert state.reset_posts == 1 and state.reset_count == 2


def test_the_control_endpoint_refuses_unknown_switches(bmc) -> None:  # type: ignore[no-untyped-def]
    state, _ = bmc
    with pytest.raises(emulator.RedfishError):
        state.set_control({"explode": 1})
    with pytest.raises(emulator.RedfishError):
        state.set_control({"refuse": -1})
    assert state.control()["refuse"] == 0


def test_a_bmc_is_reached_where_the_address_map_says() -> None:
    """``--bmc-address-map``: the Machine names the BMC as the provisioning network sees it;
    this controller reaches it at another host (the port and path stay)."""
    from gpufleet.remediate import redfish as rf

    try:
        rf.set_address_map(rf.parse_address_map("127.0.0.1=10.0.2.100"))
        assert rf.reachable("http://127.0.0.1:17687") == "http://10.0.2.100:17687"
        assert rf.reachable("https://127.0.0.1/redfish/v1") == "https://10.0.2.100/redfish/v1"
        assert rf.reachable("https://bmc-7.example:443") == "https://bmc-7.example:443"
        client = rf.RedfishClient(rf.BmcCredentials("http://127.0.0.1:17687", "u", "p"))
        assert str(client._http.base_url) == "http://10.0.2.100:17687"
    finally:
        rf.set_address_map({})
    assert rf.reachable("http://127.0.0.1:17687") == "http://127.0.0.1:17687"


@pytest.mark.parametrize("text", ["127.0.0.1", "a=", "=b", "a:1=b", "http://a=b"])
def test_a_bad_address_map_is_refused(text: str) -> None:
    from gpufleet.remediate import redfish as rf

    with pytest.raises(ValueError, match="FROM=TO"):
        rf.parse_address_map(text)
