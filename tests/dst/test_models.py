"""Slurm, the BMCs and the machines: what the models promise the products and the invariants."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.domain.ladder import Step
from gpufleet.dst.bmc import BmcModel, bmc_factory
from gpufleet.dst.choices import Choice
from gpufleet.dst.world import CURRENT, Proc, ProcSpec, World
from gpufleet.remediate.redfish import BmcCredentials, BmcOutcomeUnknown, BmcRejected
from gpufleet.slurm.errors import SlurmUnavailable


def _world() -> World:
    w = World(1, ["n1", "n2"], replay=[], shuffle=False)
    w.add_bmc(BmcModel(node="n1", endpoint="https://bmc-n1", serial="SN-n1", shutdown_s=8.0))
    return w


def test_jobs_start_only_on_idle_undrained_nodes_and_an_admin_resume_clears_any_drain() -> None:
    s = _world().slurm
    s.drain(["n1"], "gpufleet: xid79")
    assert s.candidates() == ["n2"]
    job = s.start_job("n2")
    assert s.view("n2").state == "allocated" and s.candidates() == []
    s.requeue([job.id])
    assert s.view("n2").state == "idle"
    s.admin_resume("n1")
    assert "DRAIN" not in s.view("n1").flags and s.candidates() == ["n1", "n2"]


def test_a_reboot_loses_the_jobs_and_keeps_the_drain() -> None:
    s = _world().slurm
    s.start_job("n1")
    s.drain(["n1"], "gpufleet: x")
    lost = s.reboot("n1")
    assert len(lost) == 1 and s.view("n1").state == "down"
    s.booted("n1")
    assert s.view("n1").state == "idle" and "DRAIN" in s.view("n1").flags


def test_slurm_down_fails_every_call() -> None:
    s = _world().slurm
    s.ctld_down = True
    with pytest.raises(SlurmUnavailable):
        s.drain(["n1"], "gpufleet: x")


def _drive(w: World, coro: object) -> object:
    asyncio.set_event_loop(w.loop)
    try:
        return w.loop.run_until_complete(coro)  # type: ignore[arg-type]
    finally:
        asyncio.set_event_loop(None)


def test_a_graceful_restart_moves_last_reset_time_only_after_the_os_shut_down() -> None:
    w = _world()
    w.add_process("ctl-1", _noop_spec())
    proc = w.start("ctl-1")
    m = w.bmcs["https://bmc-n1"]
    w.hw["n1"].trouble.append(("xid79", Step.REBOOT))

    async def main() -> tuple[str | None, str | None, str]:
        CURRENT.set(proc)
        async with bmc_factory(w)(BmcCredentials("https://bmc-n1", "u", "p"), "n1") as bmc:
            before = (await bmc.evidence()).last_reset_time
            await bmc.reset("GracefulRestart")
            right_after = (await bmc.evidence()).last_reset_time
            await asyncio.sleep(m.shutdown_s + 1)
            later = (await bmc.evidence()).last_reset_time
            return before, right_after, str(later)

    got = _drive(w, main())
    assert isinstance(got, tuple)
    before, right_after, later = got
    assert before is None and right_after is None and later != "None"
    assert m.posts[0][1] == "GracefulRestart" and w.hw["n1"].trouble == []


def test_refusals_lost_answers_and_the_one_time_boot() -> None:
    w = World(1, ["n1"], replay=[0, 0, 0, Choice.LOST], shuffle=False)
    m = BmcModel(node="n1", endpoint="https://bmc-n1", serial="SN-n1", refused={"PowerCycle"})
    w.add_bmc(m)
    w.add_process("ctl-1", _noop_spec())
    proc = w.start("ctl-1")

    async def main() -> None:
        CURRENT.set(proc)
        async with bmc_factory(w)(BmcCredentials("https://bmc-n1", "u", "p"), "n1") as bmc:
            with pytest.raises(BmcRejected):
                await bmc.reset("PowerCycle")  # choice 0: answered, refused
            await bmc.set_one_time_boot("Pxe")  # choice 0
            await bmc.reset("ForceOff")  # choice 0
            assert m.power == "Off" and m.boot_override == "Pxe"
            with pytest.raises(BmcOutcomeUnknown):
                await bmc.reset("On")  # choice LOST: performed, answer lost
        # The BMC shows it on at once; the firmware reads the override as it starts.
        assert m.power == "On" and m.boot_override == "Pxe"
        await asyncio.sleep(m.boot_s + 1)
        assert m.boot_override is None  # the boot used the override

    _drive(w, main())
    assert [t for _, t in m.posts] == ["ForceOff", "On"]


def _noop_spec() -> ProcSpec:
    async def main(world: World, proc: Proc) -> None:
        await asyncio.sleep(1e9)

    return ProcSpec(identity="gpufleet-controller", main=main)
