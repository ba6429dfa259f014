"""The order of a BMC step against an in-memory BMC (the Redfish emulator's tests are in
test_redfish.py): the identity comes first, the write-ahead mark is durable before the one
POST, and a reset whose answer was lost is read back, never posted twice."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.domain.ladder import Step
from gpufleet.remediate import steps
from gpufleet.remediate.evidence import ActionMark
from gpufleet.remediate.identity import ExpectedIdentity

from ..fakes import FakeBmc

EXPECTED = ExpectedIdentity(node="n1", machine="m1", serial="SN-1")


class Journal:
    """Writes the mark into the BMC's call list, so the test sees one order of events."""

    def __init__(self, bmc: FakeBmc) -> None:
        self.bmc = bmc
        self.marks: list[ActionMark] = []

    async def write(self, mark: ActionMark) -> None:
        self.marks.append(mark)
        self.bmc.calls.append(f"mark {mark.reset_type}")


def run(step: Step, bmc: FakeBmc, journal: Journal, expected: ExpectedIdentity = EXPECTED) -> str:
    return asyncio.run(
        steps.run_bmc_step(
            step,
            bmc,
            attempt=steps.Attempt(step, 1, 1000.0),
            journal=journal,
            expected=expected,
            clock=lambda: 2000.0,
            settle_s=0.0,
            graceful_settle_s=0.0,
            poll_s=0.0,
        )
    )


def test_the_mark_is_written_after_the_identity_and_before_the_one_post() -> None:
    bmc = FakeBmc()
    journal = Journal(bmc)
    assert run(Step.REBOOT, bmc, journal).endswith("GracefulRestart")
    assert bmc.calls == [
        "identity",
        "boot cleared",  # a reimage's network boot left armed never makes this a reimage
        "evidence",
        "mark GracefulRestart",
        "reset GracefulRestart",
        "evidence",  # an accepted reset is done once the BMC shows it
        "wait On",
    ]
    assert bmc.resets == 1 and journal.marks[0].baseline.last_reset_time == "t0"


def test_an_accepted_graceful_restart_the_os_ignores_fails_the_step_posted_once() -> None:
    bmc = FakeBmc()
    bmc.performs = False  # the BMC answers 200; the OS never shuts down (a hung OS)
    journal = Journal(bmc)
    with pytest.raises(steps.ResetNotPerformed, match=r"accepted.*not posted again"):
        run(Step.REBOOT, bmc, journal)
    assert [c for c in bmc.calls if c.startswith("reset ")] == ["reset GracefulRestart"]


def test_a_power_cycle_without_power_cycle_is_force_off_then_on_each_posted_once() -> None:
    """A BMC that lists no PowerCycle: ForceOff (shown by the power state; a power-off
    does not move LastResetTime), then On. Judged by LastResetTime alone, the ForceOff
    looked "not performed" and the machine was left off."""
    bmc = FakeBmc()
    bmc.allowed = ("On", "ForceOff", "GracefulRestart", "ForceRestart")
    journal = Journal(bmc)
    done = run(Step.POWER_CYCLE, bmc, journal)
    assert done.endswith("ForceOff + On") and bmc.power == "On"
    assert [c for c in bmc.calls if c.startswith("reset ")] == ["reset ForceOff", "reset On"]
    assert [m.reset_type for m in journal.marks] == ["ForceOff", "On"]


def test_a_bmc_that_is_not_the_nodes_gets_neither_a_mark_nor_a_post() -> None:
    bmc = FakeBmc(serial="SN-OTHER")
    journal = Journal(bmc)
    with pytest.raises(steps.BmcIdentityMismatch):
        run(Step.POWER_CYCLE, bmc, journal)
    assert bmc.calls == ["identity"] and journal.marks == [] and bmc.resets == 0


def test_a_lost_answer_of_a_reset_that_did_not_happen_is_not_posted_again() -> None:
    bmc = FakeBmc()
    bmc.lose_answer = False
    journal = Journal(bmc)
    with pytest.raises(steps.ResetNotPerformed):
        run(Step.POWER_CYCLE, bmc, journal)
    assert [c for c in bmc.calls if c.startswith("reset")] == ["reset PowerCycle"]
    assert bmc.resets == 0


def test_a_lost_answer_of_a_reset_that_happened_counts_as_done() -> None:
    bmc = FakeBmc()
    bmc.lose_answer = True
    assert "the BMC shows the reset happened" in run(Step.POWER_CYCLE, bmc, Journal(bmc))
    assert bmc.resets == 1
