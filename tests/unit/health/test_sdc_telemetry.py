"""Silent data corruption from job telemetry: the agent's reader votes on the replica
groups' fingerprints, reports its own node when named, and runs the SDC check when no
majority vouches for it; the simulated backend makes a silent flip visible to both."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from gpufleet.domain import conditions
from gpufleet.domain.faults import FaultKind
from gpufleet.domain.policy import Stragglers
from gpufleet.domain.stragglers import StepSample, rank_file_name, sample_line
from gpufleet.health.backend_sim import InjectionError, SimulatedHardware
from gpufleet.health.results import CheckStatus
from gpufleet.health.telemetry import JobTelemetry

from .test_job_telemetry import telemetry_agent

GOOD, BAD = "00112233445566aa", "00112233445566ab"
CONFIG = Stragglers(slower_than=1.5, window_steps=5, report_every_seconds=60)


def write(
    root: Path,
    group: int,
    node: str,
    steps: range,
    fp: dict[int, str],
    at: float = 1000.0,
    **extra: float,
) -> None:
    """Group ``g<group>`` (one rank, on ``node``) writes ``steps``; a fingerprint at the
    steps in ``fp``."""
    path = root / "train.0" / rank_file_name(group, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for step in steps:
            s = StepSample(
                "train",
                0,
                group,
                node,
                step,
                0.1,
                at + step,
                group=f"g{group}",
                fingerprint=fp.get(step),
                gpu=3,
                loss=extra.get("loss", 2.0),
                grad_norm=0.5,
            )
            f.write(sample_line(s) + "\n")


def started(root: Path, node: str) -> JobTelemetry:
    r = JobTelemetry(root, node, CONFIG, sdc_report_every_s=60, check_every_s=30)
    assert r.poll(0.0) == []
    return r


def test_the_node_the_majority_names_reports_sdc_mismatch_once_per_spacing(tmp_path: Path) -> None:
    bad, good = started(tmp_path, "n1"), started(tmp_path, "n0")
    for g, value in enumerate((GOOD, BAD, GOOD)):
        write(tmp_path, g, f"n{g}", range(1, 11), {5: GOOD, 10: value})
    (fault,) = bad.poll(1011.0)
    assert fault.kind is FaultKind.SDC_MISMATCH and fault.node == "n1"
    assert fault.evidence.gpu_index == 3 and fault.evidence.counters["step"] == 10
    assert fault.evidence.message == (
        f"training train step 10: group g1 holds weights {BAD}, 2 of 3 replica groups hold "
        f"{GOOD}; GPU 3"
    )
    assert good.poll(1011.0) == [] and good.take_suspicions() == []
    assert bad.take_suspicions() == []
    for g, value in enumerate((GOOD, BAD, GOOD)):
        write(tmp_path, g, f"n{g}", range(11, 16), {15: value})
    assert bad.poll(1016.0) == []  # named again, but reported 5 s ago
    for g, value in enumerate((GOOD, BAD, GOOD)):
        write(tmp_path, g, f"n{g}", range(16, 21), {20: value})
    assert [f.evidence.counters["step"] for f in bad.poll(1080.0)] == [20]


def test_two_groups_that_disagree_ask_for_the_check_once_per_step_and_spacing(
    tmp_path: Path,
) -> None:
    r = started(tmp_path, "n1")
    write(tmp_path, 0, "n0", range(1, 11), {10: GOOD})
    write(tmp_path, 1, "n1", range(1, 11), {10: BAD})
    assert r.poll(1011.0) == []
    (why,) = r.take_suspicions()
    assert why == (
        "training train step 10: 2 replica groups hold different weights and no majority "
        "of them agrees"
    )
    assert r.poll(1012.0) == [] and r.take_suspicions() == []  # nothing new
    write(tmp_path, 0, "n0", range(11, 16), {15: GOOD})
    write(tmp_path, 1, "n1", range(11, 16), {15: BAD})
    assert r.poll(1016.0) == [] and r.take_suspicions() == []  # asked 5 s ago
    write(tmp_path, 0, "n0", range(16, 21), {20: GOOD})
    write(tmp_path, 1, "n1", range(16, 21), {20: BAD})
    assert r.poll(1050.0) == [] and len(r.take_suspicions()) == 1


def test_a_group_whose_loss_stands_out_asks_for_the_check(tmp_path: Path) -> None:
    r = started(tmp_path, "n2")
    for g in range(3):
        write(tmp_path, g, f"n{g}", range(1, 6), {}, loss=2.0 + 0.01 * g)
    write(tmp_path, 3, "n3", range(1, 6), {}, loss=2.02)
    for g in range(4):
        write(tmp_path, g, f"n{g}", range(6, 10), {}, loss=math.nan if g == 2 else 2.0 + 0.01 * g)
    assert r.poll(1011.0) == []
    (why,) = r.take_suspicions()
    assert why.startswith("training train: group g2's loss stood out at 4 step(s), nan vs.")


@pytest.mark.parametrize("silent", [True, False])
def test_the_agent_runs_the_sdc_check_on_suspicion_and_its_result_decides(
    tmp_path: Path, silent: bool
) -> None:
    """Two groups disagree: the agent runs the SDC check (beside the job's GPU processes);
    on a GPU with a silent flip it fails and the node reports sdc-mismatch naming that GPU
    and the suspicion; on a healthy node it passes and nothing is reported."""
    hw = SimulatedHardware(node="n1")
    try:
        if silent:
            hw.inject("sdc-silent,gpu=6,step=8")
        hw.inject("busy")  # the job's processes do not hold the check back
        agent, rep = telemetry_agent(hw, started(tmp_path, "n1"))
        write(tmp_path, 0, "n0", range(1, 11), {10: GOOD})
        write(tmp_path, 1, "n1", range(1, 11), {10: BAD})
        changed, events = agent.step(1011.0)
        asyncio.run(agent.publish(changed, events, 1011.0))
        (result,) = agent.check_suspected(1011.5)
        assert result.name == "sdc"
        assert result.status is (CheckStatus.CRITICAL if silent else CheckStatus.OK)
        changed, events = agent.step(1012.0)
        asyncio.run(agent.publish(changed, events, 1012.0))
        cond = rep.conditions["GpuProblem"]
        assert cond.status == ("True" if silent else "False")
        if silent:
            (fault,) = conditions.faults_of("n1", cond.type, cond.status, cond.message)
            assert fault.kind is FaultKind.SDC_MISMATCH and fault.evidence.gpu_index == 6
            assert "2 replica groups hold different weights" in fault.evidence.message
    finally:
        hw.close()


def test_sdc_silent_publishes_the_flip_step_and_fails_the_check(tmp_path: Path) -> None:
    hw = SimulatedHardware(node="n1", gpus=2, publish_dir=tmp_path)
    try:
        assert "sdc_flip_at_step" not in json.loads((tmp_path / "n1.json").read_text())
        hw.inject("sdc-silent,gpu=1,step=40")
        doc = json.loads((tmp_path / "n1.json").read_text())
        assert doc["sdc_flip_at_step"] == 40
        assert doc["gpus"][1] == {"index": 1, "speed": 1.0, "sdc_flip_at_step": 40}
        for bad in ("sdc-silent,gpu=1", "sdc-silent,gpu=1,step=-1", "sdc-silent,gpu=9,step=1"):
            with pytest.raises(InjectionError):
                hw.inject(bad)
        hw.recover()
        assert "sdc_flip_at_step" not in json.loads((tmp_path / "n1.json").read_text())
    finally:
        hw.close()


def test_a_training_started_again_under_its_name_is_voted_on_from_its_first_step(
    tmp_path: Path,
) -> None:
    """Replica-group trainings are run 0 whatever happens: after the training went quiet,
    one of the same name starts at step 1 again and is judged from there."""
    r = started(tmp_path, "n1")
    for g in range(3):
        write(tmp_path, g, f"n{g}", range(1, 31), {30: GOOD})
    assert r.poll(1031.0) == []
    assert r.poll(1700.0) == []  # idle for more than 600 s: ended
    for g, value in enumerate((GOOD, BAD, GOOD)):
        write(tmp_path, g, f"n{g}", range(1, 11), {10: value}, at=2000.0)
    (fault,) = r.poll(2011.0)
    assert fault.evidence.counters["step"] == 10
