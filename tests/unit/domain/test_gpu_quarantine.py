"""Per-GPU quarantine: the record's codec, and the decision (domain.gpu_quarantine)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gpufleet.domain import events as ev
from gpufleet.domain import gpu_quarantine as quarantine
from gpufleet.domain.actions import ActionKind
from gpufleet.domain.decide import Decision
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.faults import FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import (
    DrainMode,
    Policy,
    PolicyError,
    RequeueMode,
    default_policy,
    load_policy,
)
from gpufleet.domain.policy_groups import policy_for
from gpufleet.domain.records import NodeRecord, QuarantinedGpu, record_from_json, record_to_json
from gpufleet.domain.safety import Hold
from gpufleet.domain.states import NodeState

from .conftest import fault, make_fleet, xid

S = NodeState


def test_record_round_trips_quarantined_gpus_and_omits_none() -> None:
    plain = NodeRecord.new("n1", at=0.0)
    assert "quarantined_gpus" not in record_to_json(plain)
    out = replace(
        plain,
        quarantined_gpus=(
            QuarantinedGpu(index=3, uuid="GPU-abc", fault="xid-94", since=12.5),
            QuarantinedGpu(index=5, uuid="", fault="row-remap-pending", since=13.0),
        ),
    )
    text = record_to_json(out)
    assert json.loads(text)["quarantined_gpus"][0] == {
        "index": 3,
        "uuid": "GPU-abc",
        "fault": "xid-94",
        "since": 12.5,
    }
    assert record_from_json(text) == out


def test_record_written_before_quarantine_reads_as_none() -> None:
    older = json.loads(record_to_json(NodeRecord.new("n1", at=0.0)))
    assert record_from_json(json.dumps(older)).quarantined_gpus == ()


# --------------------------------------------------------------------- the decision


def _policy(quarantine: dict[str, object] | None, **top: object) -> Policy:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    if quarantine is not None:
        data["gpuQuarantine"] = quarantine
    data.update(top)
    return load_policy(yaml.safe_dump(data))


ON = {"enabled": True, "repairAfterSeconds": 3600}


def kinds(d: Decision) -> list[ActionKind]:
    return [a.kind for a in d.actions]


def remap(node: str, at: float, gpu: int | None = 3) -> ev.FaultObserved:
    if gpu is None:
        return fault(node, FaultKind.ROW_REMAP_PENDING, at=at)
    return fault(node, FaultKind.ROW_REMAP_PENDING, at=at, gpu_index=gpu)


def test_off_by_default_the_node_is_taken_as_before() -> None:
    f = make_fleet(10)
    assert default_policy().gpu_quarantine.enabled is False
    f.send("n1", remap("n1", at=1), now=1)
    assert f.state("n1") is S.DRAINING
    assert f.records["n1"].quarantined_gpus == ()


def test_a_contained_fault_quarantines_its_gpu_and_the_node_keeps_serving() -> None:
    f = make_fleet(10, _policy(ON))
    d = f.send("n1", remap("n1", at=5), now=5)
    assert f.state("n1") is S.PRODUCTION
    assert d.transition is None
    assert kinds(d) == [ActionKind.QUARANTINE_GPU]
    assert d.actions[0].gpu == 3
    assert "GPU 3 quarantined" in d.actions[0].detail
    assert f.records["n1"].quarantined_gpus == (
        QuarantinedGpu(index=3, uuid="", fault="row-remap-pending", since=5),
    )
    assert any("keeps serving on its other GPUs" in r for r in d.reasons)
    assert f.view.pool("default").out_of_service == 0  # the budget counts it in service
    assert not any(a.disruptive for a in d.actions)


def test_xid94_restarts_the_job_once_and_quarantines_on_its_repeat() -> None:
    f = make_fleet(10, _policy(ON))
    d = f.send("n1", xid("n1", 94, at=1, gpu=6), now=1)
    assert kinds(d) == [ActionKind.RESTART_JOB]
    assert f.records["n1"].quarantined_gpus == ()
    d = f.send("n1", xid("n1", 94, at=2, gpu=6), now=2)
    assert kinds(d) == [ActionKind.QUARANTINE_GPU]
    assert f.state("n1") is S.PRODUCTION
    assert [q.fault for q in f.records["n1"].quarantined_gpus] == ["xid-94"]


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (xid("n1", 79, at=1, gpu=2), "xid-79 does not allow quarantining one GPU"),
        (xid("n1", 95, at=1, gpu=2), "xid-95 does not allow quarantining one GPU"),
        (remap("n1", at=1, gpu=None), "row-remap-pending names no GPU"),
    ],
)
def test_a_fault_that_does_not_qualify_takes_the_node(event: ev.FaultObserved, why: str) -> None:
    f = make_fleet(10, _policy(ON))
    d = f.send("n1", event, now=1)
    assert f.state("n1") is S.DRAINING
    assert f.records["n1"].quarantined_gpus == ()
    assert any(why in r for r in d.reasons), d.reasons


def test_a_repeat_on_the_quarantined_gpu_or_one_gpu_too_many_takes_the_node() -> None:
    f = make_fleet(10, _policy(ON))
    f.send("n1", remap("n1", at=1, gpu=3), now=1)
    d = f.send("n1", fault("n1", FaultKind.ECC_UNCORRECTABLE, at=2, gpu_index=3), now=2)
    assert f.state("n1") is S.DRAINING
    assert any("GPU 3 is already quarantined" in r for r in d.reasons)
    f = make_fleet(10, _policy(ON))
    f.send("n2", remap("n2", at=1, gpu=1), now=1)
    d = f.send("n2", remap("n2", at=2, gpu=4), now=2)
    assert f.state("n2") is S.DRAINING
    assert any("at most 1 per node" in r for r in d.reasons)
    g = make_fleet(10, _policy({**ON, "maxGpusPerNode": 2}))
    g.send("n2", remap("n2", at=1, gpu=1), now=1)
    g.send("n2", remap("n2", at=2, gpu=4), now=2)
    assert g.state("n2") is S.PRODUCTION
    assert [q.index for q in g.records["n2"].quarantined_gpus] == [1, 4]


def test_paused_the_quarantine_is_held_and_applied_once_resumed() -> None:
    f = make_fleet(10, _policy(ON, paused=True))
    d = f.send("n1", remap("n1", at=1), now=1)
    assert d.hold is Hold.PAUSED
    assert [a.kind for a in d.withheld] == [ActionKind.QUARANTINE_GPU]
    assert f.records["n1"].quarantined_gpus == ()
    assert f.records["n1"].pending is not None
    f.policy = _policy(ON)
    d = f.send("n1", ev.Tick(), now=2)
    assert kinds(d) == [ActionKind.QUARANTINE_GPU, ActionKind.NOTIFY]
    assert "held fault row-remap-pending handled" in d.actions[1].detail
    assert f.records["n1"].pending is None
    assert [q.index for q in f.records["n1"].quarantined_gpus] == [3]


def test_the_repair_drains_letting_jobs_finish_and_verification_releases_the_gpu() -> None:
    f = make_fleet(10, _policy(ON))
    f.send("n1", remap("n1", at=10), now=10)
    d = f.send("n1", ev.Tick(), now=10 + 3599)
    assert f.state("n1") is S.PRODUCTION and not d.actions
    d = f.send("n1", ev.Tick(), now=10 + 3600)
    assert f.state("n1") is S.DRAINING
    assert kinds(d) == [ActionKind.CORDON, ActionKind.TAINT, ActionKind.DRAIN]
    assert d.actions[2].drain_mode is DrainMode.WAIT
    assert d.actions[2].requeue is RequeueMode.LET_FINISH
    assert "repair of quarantined GPU 3 (row-remap-pending)" in d.transition.reason
    assert [q.index for q in f.records["n1"].quarantined_gpus] == [3]  # still out meanwhile
    d = f.send("n1", ev.DrainCompleted(), now=4000)
    assert [(a.kind, a.step) for a in d.actions] == [(ActionKind.RUN_STEP, Step.GPU_RESET)]
    f.send("n1", ev.StepCompleted(Step.GPU_RESET, succeeded=True), now=4100)
    d = f.send("n1", ev.ChecksCompleted(passed=True), now=4200)
    assert f.state("n1") is S.PRODUCTION
    assert [(a.kind, a.gpu) for a in d.actions if a.kind is ActionKind.RELEASE_GPU] == [
        (ActionKind.RELEASE_GPU, 3)
    ]
    assert f.records["n1"].quarantined_gpus == ()


def test_the_repair_waits_for_the_budget() -> None:
    f = make_fleet(2, _policy(ON, safety={"budget": {"maxNodes": 0, "minNodes": 0}}))
    f.send("n1", remap("n1", at=0), now=0)
    assert f.state("n1") is S.PRODUCTION  # the quarantine itself: no budget needed
    d = f.send("n1", ev.Tick(), now=3600)
    assert d.hold is Hold.BUDGET_EXHAUSTED
    assert f.state("n1") is S.PRODUCTION
    assert [q.index for q in f.records["n1"].quarantined_gpus] == [3]


def test_a_node_group_may_set_its_own_quarantine() -> None:
    policy = _policy(
        None,
        overrides=[
            {
                "name": "inference",
                "nodeSelector": {"matchLabels": {"tier": "inference"}},
                "gpuQuarantine": {"enabled": True, "maxGpusPerNode": 2},
            }
        ],
    )
    assert policy_for(policy, {"tier": "inference"}).policy.gpu_quarantine.max_gpus_per_node == 2
    assert policy_for(policy, {}).policy.gpu_quarantine.enabled is False
    with pytest.raises(PolicyError):
        _policy({"enabled": True, "maxGpusPerNode": 0})


def test_choose_says_why_for_every_answer() -> None:
    config = _policy(ON).gpu_quarantine
    rec = NodeRecord.new("n1", at=0.0, state=S.PRODUCTION)
    ev94 = xid("n1", 94, at=1, gpu=2).fault
    assert quarantine.choose(config, rec, ev94, Step.GPU_RESET, 1).gpu is not None
    reboot = quarantine.choose(config, rec, ev94, Step.REBOOT, 1)
    assert reboot.gpu is None and "more than a GPU reset" in reboot.why
    draining = replace(rec, state=S.DRAINING)
    assert "not production" in quarantine.choose(config, draining, ev94, Step.GPU_RESET, 1).why


def test_docs_faults_names_every_fault_that_quarantines_a_gpu() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "faults.md").read_text()
    section = doc.split("## GPU quarantine", 1)[1]
    for key in quarantine.QUARANTINABLE:
        name = f"XID {key.removeprefix('xid-')}," if key.startswith("xid-") else f"`{key}`"
        assert name in section, f"{key} is not in docs/faults.md's GPU quarantine section"
