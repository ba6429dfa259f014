"""What the controller reads from a Node: new faults only, cleared pending faults, answers."""

from __future__ import annotations

import json
from dataclasses import replace

from gpufleet.domain import conditions, events, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.records import Incident, NodeRecord, StepAttempt
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle import nodes

from .fakes import KEY, node, set_condition


def xid(at: float, number: int = 79) -> FaultEvent:
    return FaultEvent(FaultKind.XID, "n1", at=at, xid=number, evidence=Evidence(gpu_index=1))


def test_a_fault_is_fed_once_and_the_watermark_remembers_it() -> None:
    body = node("n1")
    set_condition(body, conditions.problem(Subsystem.PCIE, [xid(10.0)]))
    rec, new = nodes.record_of(body, 100.0)
    assert new and rec.state is NodeState.PRODUCTION
    obs = nodes.observe(body, rec)
    assert [type(e) for e in obs.events] == [events.FaultObserved]
    body["metadata"]["annotations"][well_known.ANNOTATION_FAULTS_SEEN] = json.dumps(obs.seen)
    assert nodes.observe(body, rec).events == ()
    set_condition(body, conditions.problem(Subsystem.PCIE, [xid(10.0), xid(20.0)]))
    again = nodes.observe(body, rec).events
    assert len(again) == 1 and again[0].fault.at == 20.0  # type: ignore[union-attr]


def test_a_held_fault_is_not_cleared_when_its_condition_clears() -> None:
    body = node("n1")
    rec = replace(NodeRecord.new("n1", at=0, state=NodeState.PRODUCTION), pending=xid(5.0))
    set_condition(body, conditions.healthy(Subsystem.PCIE))
    assert nodes.observe(body, rec).events == ()


def test_only_the_answer_to_the_current_request_counts() -> None:
    inc = Incident(key="xid-48", description="x", opened_at=1.0, plan=None, checks_started_at=2.5)
    rec = replace(NodeRecord.new("n1", at=0, state=NodeState.VERIFYING), incident=inc)
    assert nodes.request_id(rec) == "verify-2500"
    body = node("n1")
    set_condition(body, conditions.AgentResult("verify-1000", True).condition())
    assert nodes.observe(body, rec).events == ()
    set_condition(body, conditions.AgentResult("verify-2500", False, "hbm low").condition())
    assert nodes.observe(body, rec).events == (events.ChecksCompleted(False, "hbm low"),)


def test_a_gpu_reset_answer_completes_the_step() -> None:
    from gpufleet.domain.ladder import Step

    inc = Incident(
        key="xid-48",
        description="x",
        opened_at=1.0,
        plan=Step.GPU_RESET,
        current=Step.GPU_RESET,
        tried=(StepAttempt(Step.GPU_RESET, 1, 3.0),),
    )
    rec = replace(NodeRecord.new("n1", at=0, state=NodeState.REMEDIATING), incident=inc)
    body = node("n1")
    set_condition(body, conditions.AgentResult("gpu-reset-1-3000", True, "ok").condition())
    assert nodes.observe(body, rec).events == (events.StepCompleted(Step.GPU_RESET, True, "ok"),)


def test_a_node_labelled_provisioning_starts_there() -> None:
    body = node("n1")
    body["metadata"]["labels"][well_known.LABEL_STATE] = "provisioning"
    rec, new = nodes.record_of(body, 5.0)
    assert new and rec.state is NodeState.PROVISIONING


def test_our_taint_is_put_back_if_someone_removes_it_while_the_node_is_out() -> None:
    from gpufleet.domain.policy import TaintEffect

    inc = Incident(
        key="xid-79", description="x", opened_at=1.0, plan=None, taint=TaintEffect.NO_EXECUTE
    )
    inc = replace(inc, plan=__import__("gpufleet.domain.ladder", fromlist=["Step"]).Step.REBOOT)
    rec = replace(NodeRecord.new("n1", at=0, state=NodeState.DRAINING), incident=inc)
    body = node("n1", unschedulable=True)
    body["metadata"]["annotations"][well_known.ANNOTATION_CORDONED] = well_known.CONTROLLER
    patch = nodes.node_patch(body, rec, (), key=KEY)
    assert patch["spec"]["taints"] == [
        {"key": well_known.TAINT_UNHEALTHY, "value": "xid-79", "effect": "NoExecute"}
    ]


def test_a_held_trays_taint_is_put_back_but_no_taint_is_added_for_maintenance() -> None:
    """Both incidents have no plan: the held tray's is a fault's (decision 0240), an
    operator's maintenance sets no taint."""
    from gpufleet.domain import domain_faults

    held = Incident(key=domain_faults.KEY, description="x", opened_at=1.0, plan=None)
    planned = Incident(key="maintenance", description="x", opened_at=1.0, plan=None)
    body = node("n1", unschedulable=True)
    body["metadata"]["annotations"][well_known.ANNOTATION_CORDONED] = well_known.CONTROLLER
    back = {"key": well_known.TAINT_UNHEALTHY, "value": "nvlink-domain", "effect": "NoSchedule"}
    for inc, taints in ((held, [back]), (planned, None)):
        rec = replace(NodeRecord.new("n1", at=0, state=NodeState.DRAINING), incident=inc)
        assert nodes.node_patch(body, rec, (), key=KEY).get("spec", {}).get("taints") == taints


def test_the_lemon_score_is_written_on_the_node_and_removed_with_new_hardware() -> None:
    from gpufleet.domain import lemon

    score = lemon.add(None, weight=1.0, scope="gpu3", now=0.0, half_life_seconds=86400.0)
    score = lemon.add(score, weight=0.5, scope="gpu0", now=0.0, half_life_seconds=86400.0)
    rec = replace(NodeRecord.new("n1", at=0, state=NodeState.PRODUCTION), lemon=score)
    ann = nodes.node_patch(node("n1"), rec, (), key=KEY)["metadata"]["annotations"]
    assert ann[well_known.ANNOTATION_LEMON_SCORE] == "1.50"
    assert ann[well_known.ANNOTATION_LEMON_GPUS] == "gpu3=1.00,gpu0=0.50"
    fresh = replace(rec, lemon=None)
    ann = nodes.node_patch(node("n1"), fresh, (), key=KEY)["metadata"]["annotations"]
    assert ann[well_known.ANNOTATION_LEMON_SCORE] is None
    assert ann[well_known.ANNOTATION_LEMON_GPUS] is None


def test_a_spare_carries_its_label_and_taint_until_promoted() -> None:
    spare = replace(NodeRecord.new("n1", at=0, state=NodeState.PRODUCTION), spare=True)
    body = node("n1")
    patch = nodes.node_patch(body, spare, (), key=KEY)
    assert patch["metadata"]["labels"][well_known.LABEL_SPARE] == "true"
    taint = {"key": well_known.TAINT_SPARE, "value": "true", "effect": "NoSchedule"}
    assert patch["spec"]["taints"] == [taint]
    body = nodes.apply_merge_patch(body, patch)
    promoted = nodes.node_patch(body, replace(spare, spare=False), (), key=KEY)
    assert promoted["metadata"]["labels"][well_known.LABEL_SPARE] is None
    assert promoted["spec"]["taints"] is None
