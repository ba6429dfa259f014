"""The domain burn-in's Slurm side without Slurm: the srun it runs, the drains it reads
back (scontrol -o show node lines), and that it refuses before changing anything."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gpufleet.slurm import domain_burnin as runner

LINE = (
    "NodeName={name} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 "
    "Gres=gpu:8 NodeAddr=127.0.0.1 NodeHostName={name} Version=24.11.1 State={state} "
    "ThreadsPerCore=1 Weight=1 Owner=N/A Partitions=gpu LastBusyTime=2026-11-29T18:00:01 "
    "CfgTRES=cpu=2,mem=1G,billing=2 AllocTRES= CurrentWatts=0 AveWatts=0{reason}"
)


def _line(name: str, state: str, reason: str | None = None) -> str:
    tail = f" Reason={reason} [root@2026-11-29T18:01:02]" if reason else ""
    return LINE.format(name=name, state=state, reason=tail)


class FakeScontrol:
    def __init__(self, shown: str, refuse: str | None = None) -> None:
        self.shown = shown
        self.refuse = refuse
        self.calls: list[tuple[str, ...]] = []

    async def run(self, *args: str) -> str:
        self.calls.append(args)
        if args[:2] == ("create", "reservation") and self.refuse:
            from gpufleet.slurm.errors import SlurmCommandFailed

            raise SlurmCommandFailed(["scontrol", *args], 1, self.refuse)
        return self.shown if args[:2] == ("-o", "show") else ""

    async def undrain(self, nodes: Any) -> None:
        self.calls.append(("undrain", *nodes))

    async def drain(self, nodes: Any, reason: str) -> None:
        self.calls.append(("drain", reason, *nodes))

    async def delete_reservation(self, name: str) -> None:
        self.calls.append(("delete", name))


JOB = runner.Job(
    domain="nvl72/rack 7",
    trays=("gb-3", "gb-1", "gb-2"),
    program={"trays": ["gb-1", "gb-2", "gb-3"], "iters": 5},
    python="/opt/venv/bin/python",
    ranks_per_node=4,
    timeout_s=300,
)


def test_the_srun_runs_one_step_on_exactly_the_trays_inside_the_reservation() -> None:
    argv = runner.argv(JOB)
    assert argv[0] == "srun" and "--reservation=gpufleet-burnin-nvl72-rack-7" in argv
    assert "--nodelist=gb-[1-3]" in argv and "--nodes=3" in argv
    assert "--ntasks-per-node=4" in argv and "--exclusive" in argv and "--immediate=30" in argv
    assert argv[-4:-1] == ["/opt/venv/bin/python", "-m", "gpufleet.health.domain_allreduce"]
    assert json.loads(argv[-1]) == dict(JOB.program)


def test_drains_are_read_back_with_their_own_reason() -> None:
    shown = "\n".join(
        [
            _line("gb-1", "IDLE+DRAIN", "gpufleet: state burn-in"),
            _line("gb-2", "IDLE"),
            _line("gb-3", "IDLE+DRAIN", "gpufleet: xid79 gpu=0 count=2"),
        ]
    )
    found = asyncio.run(runner.drains(FakeScontrol(shown), ["gb-1", "gb-2", "gb-3"]))  # type: ignore[arg-type]
    assert found == {
        "gb-1": "gpufleet: state burn-in",
        "gb-2": None,
        "gb-3": "gpufleet: xid79 gpu=0 count=2",
    }


@pytest.mark.parametrize(
    ("shown", "refuse", "why"),
    [
        (_line("gb-1", "IDLE+DRAIN", "bios update by alice"), None, "drained by someone else"),
        ("", None, "Slurm does not know"),
        (_line("gb-1", "IDLE"), "Requested nodes are busy", "Slurm refused the reservation"),
    ],
)
def test_it_refuses_before_it_changes_anything(
    shown: str, refuse: str | None, why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_jobs(job: runner.Job) -> list[str]:
        return []

    monkeypatch.setattr(runner, "jobs_on", no_jobs)
    job = runner.Job("d", ("gb-1",), {}, "python")
    fake = FakeScontrol(shown, refuse)
    with pytest.raises(runner.Refused, match=why):
        asyncio.run(runner.run(job, fake))  # type: ignore[arg-type]
    assert not any(c[0] in ("undrain", "drain", "delete") for c in fake.calls)


def test_a_job_on_a_tray_stops_it_before_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    async def busy(job: runner.Job) -> list[str]:
        return ["4242@gb-2"]

    monkeypatch.setattr(runner, "jobs_on", busy)
    fake = FakeScontrol("")
    with pytest.raises(runner.Refused, match="job\\(s\\) on the trays: 4242@gb-2"):
        asyncio.run(runner.run(JOB, fake))  # type: ignore[arg-type]
    assert fake.calls == []
