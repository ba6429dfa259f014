"""A reimage's one-time network boot and the firmware that reads it (decisions 0177, 0255,
0256): an operator's ``gpufleet node triage`` in the middle of a reimage neither cancels
the network boot the machine's firmware is about to read nor leaves one armed that
nothing will read; an override left armed in a run's last seconds is still judged.

Each story is one fault the ladder takes up to a reimage (``xid79-dead``: a GracefulRestart,
a PowerCycle, then the reimage's ``Pxe`` override and its PowerCycle POST at 74.9; the
model's firmware reads the override as the boot ends, 20 s later) and one more event,
every scheduling choice the default.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from gpufleet.dst.runner import Result, Spec, run
from gpufleet.dst.scenario import Config, Env
from gpufleet.dst.world import World
from gpufleet.lifecycle.gated_steps import GatedSteps

QUIET = Config(duration=300.0, calm_s=120.0)
FAULT = Env(30.0, "fault", ("n1", "xid79-dead", 0))
RESET_AT = 74.944
"""The reimage's PowerCycle, as the BMC performs it."""
NO_POWER_ON = (
    Env(70.0, "bmc-refuse", ("n1", "PowerCycle", 300)),
    Env(70.0, "bmc-refuse", ("n1", "On", 300)),
)
"""The BMC refuses PowerCycle (the power cycle becomes ForceOff + On) and the On."""


def story(*events: Env, config: Config = QUIET) -> tuple[Result, dict[str, object]]:
    seen: dict[str, object] = {}

    def look(world: World) -> None:
        bmc = world.bmc_of("n1")
        seen["network_boots"] = bmc.network_boots
        seen["armed"] = bmc.boot_override

    spec = Spec(1, config, events=(FAULT, *events), choices=(), shuffle=False)
    return run(spec, inspect=look), seen


def clears(r: Result) -> list[float]:
    """When the override was removed, from the reimage on (each step before it removes
    one first, armed or not)."""
    return [ln.at for ln in r.lines if ln.call == "n1 PATCH Boot None" and ln.at > 74.0]


def test_the_reimage_alone_boots_from_the_network() -> None:
    r, seen = story()
    assert r.violation is None, r.violation.line()
    assert any(ln.call == "n1 POST Reset PowerCycle" and ln.at == RESET_AT for ln in r.lines)
    assert seen == {"network_boots": 1, "armed": None}


def test_a_triage_while_the_firmware_starts_leaves_the_network_boot_to_it() -> None:
    """Seed 37 of ``bench/dst_soak.py --seeds 40 --slurmd-roll``: an operator's triage 1.1 s
    after the reimage's reset. The record left verification, and the cleanup removed the
    override at 78.0, 17 s before the firmware read it: the machine booted its old disk
    (``1b/network-boot-cancelled`` at 94.9). Now the gate keeps it while the machine may be
    starting from the reset; the cleanup finds it used and only removes the mark."""
    r, seen = story(Env(76.0, "operator", ("n1", "triage", 200)))
    assert r.violation is None, r.violation.line()
    assert seen["network_boots"] == 1
    assert clears(r) and min(clears(r)) > RESET_AT + 20.0


def test_a_triage_between_the_override_and_the_reset_does_not_cancel_the_boot_it_uses() -> None:
    """The triage lands after the reimage's mark for its PowerCycle and before the POST (the
    mark is the commit point: the POST still goes). The attempt's cleanup used to run beside
    its own task and removed the override in between: the reimage's reset went out as a
    plain power cycle. The cleanup now waits for the node's act task to end."""
    r, seen = story(Env(74.6, "operator", ("n1", "triage", 200)))
    assert r.violation is None, r.violation.line()
    assert seen["network_boots"] == 1
    assert all(at > RESET_AT for at in clears(r))


def test_a_reimage_stopped_at_its_forceoff_leaves_no_network_boot_armed() -> None:
    """Seed 1015's shape: the BMC refuses PowerCycle, and then the ``On`` of the
    ForceOff + On; the step fails with the machine off and the override armed, and the node
    goes to triage. Nothing is starting: the override goes at once."""
    r, seen = story(*NO_POWER_ON)
    assert r.violation is None, r.violation.line()
    assert any("POST Reset ForceOff" in ln.call for ln in r.lines)
    assert seen == {"network_boots": 0, "armed": None}


def test_an_override_left_armed_in_the_last_seconds_of_a_run_is_still_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A controller that never cleans up, and a run that ends 3 s after the reimage stopped
    at its ForceOff: the drain-out runs on until the override's grace has passed, and 1b
    fails. Without it, the run ended before anything was judged."""
    short = replace(QUIET, duration=40.0, calm_s=38.0)
    r, _ = story(*NO_POWER_ON, config=short)
    assert r.violation is None, r.violation.line()

    async def never(self: GatedSteps, name: str, ended: object) -> None:
        return None

    monkeypatch.setattr(GatedSteps, "_cleanup", never)
    r, seen = story(*NO_POWER_ON, config=short)
    assert seen["armed"] == "Pxe"
    assert r.violation is not None and r.violation.invariant == "1b", r.violation
    assert r.violation.at > short.duration + short.calm_s


def _slow_cleanup(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The cleanup takes ``seconds`` (virtual) before it reaches the BMC: a slow BMC or
    apiserver, as in the seed that found the pause below."""
    cleanup = GatedSteps._cleanup

    async def slow(self: GatedSteps, name: str, ended: tuple[Any, ...]) -> None:
        await asyncio.sleep(seconds)
        await cleanup(self, name, ended)

    monkeypatch.setattr(GatedSteps, "_cleanup", slow)


def test_a_pause_does_not_stop_the_cleanup_of_an_armed_network_boot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed 32 of the bounded runs: the reimage failed after arming its network boot, the
    node went to triage, and the policy was paused while the cleanup ran. The pause
    cancelled the cleanup with the acts, and the tick's sweep skipped paused policies, so
    the machine stayed set to reimage itself at its next reset for the whole pause (1b).
    The cleanup now runs on under a pause (decision 0295)."""
    _slow_cleanup(monkeypatch, 5.0)
    r, seen = story(*NO_POWER_ON, Env(77.0, "pause", (200,)))
    assert r.violation is None, r.violation.line()
    assert seen == {"network_boots": 0, "armed": None}
    assert clears(r) and min(clears(r)) < 77.0 + 30.0


def test_a_paused_controller_sweeps_an_armed_network_boot_after_a_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller dies during that cleanup while the policy is paused: the restarted one
    finds the reimage's mark on a node in triage and removes the override, paused."""
    _slow_cleanup(monkeypatch, 5.0)
    r, seen = story(*NO_POWER_ON, Env(76.0, "pause", (200,)), Env(77.0, "kill", ("ctl-1", 2)))
    assert r.violation is None, r.violation.line()
    assert any(ln.proc == "ctl-1#1" and ln.call == "killed" for ln in r.lines)
    assert seen == {"network_boots": 0, "armed": None}
    assert clears(r) and min(clears(r)) < 76.0 + 60.0
