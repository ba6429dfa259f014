"""Which agent requests are legitimate (bound to the node's current decision), and
when work on the node refuses even a legitimate one (decision 0074)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import agent_requests as ar
from gpufleet.domain import conditions as c
from gpufleet.domain.emptiness import SlurmWork, pod_holds_node
from gpufleet.domain.ladder import Step
from gpufleet.domain.records import (
    Incident,
    NodeRecord,
    StepAttempt,
    record_from_json,
    record_to_json,
)
from gpufleet.domain.states import NodeState

OPENED = 1751234567.123456
STARTED = 1751234600.987654


def remediating(
    node: str = "n1", *, ended: bool = False, step: Step = Step.GPU_RESET
) -> NodeRecord:
    attempt = StepAttempt(step, 1, STARTED, ended_at=STARTED + 5 if ended else None)
    inc = Incident(
        key="xid-48",
        description="x",
        opened_at=OPENED,
        plan=Step.GPU_RESET,
        current=step,
        tried=(attempt,),
    )
    return replace(NodeRecord.new(node, at=0, state=NodeState.REMEDIATING), incident=inc)


def verifying(node: str = "n1") -> NodeRecord:
    inc = Incident(
        key="xid-48",
        description="x",
        opened_at=OPENED,
        plan=Step.GPU_RESET,
        checks_started_at=STARTED,
    )
    return replace(NodeRecord.new(node, at=0, state=NodeState.VERIFYING), incident=inc)


def burn_in(node: str = "n1") -> NodeRecord:
    return replace(NodeRecord.new(node, at=0, state=NodeState.BURN_IN), checks_started_at=STARTED)


def wire(req: c.AgentRequest | None) -> c.AgentRequest:
    """Through the annotation and back, as the agent reads it."""
    assert req is not None
    decoded = c.decode_request(req.encode())
    assert decoded is not None
    return decoded


def stored(record: NodeRecord) -> NodeRecord:
    """Through the record annotation and back, as the agent reads it."""
    return record_from_json(record_to_json(record))


@pytest.mark.parametrize(
    ("record", "kind", "profile"),
    [
        (remediating(), "gpu-reset", None),
        (verifying(), "checks", "verify"),
        (burn_in(), "checks", "burn-in"),
    ],
)
def test_the_request_the_controller_issues_is_legitimate_after_the_round_trip(
    record: NodeRecord, kind: c.RequestKind, profile: str | None
) -> None:
    req = wire(ar.issue(record, kind, profile=profile))
    assert req.binding is not None and req.binding.node == "n1"
    assert req.binding.state == record.state.value
    assert req.id == ar.request_id(record)
    assert ar.refusal(req, "n1", stored(record)) is None


def test_a_hand_written_request_without_binding_is_refused() -> None:
    req = wire(c.AgentRequest(id=ar.request_id(remediating()) or "", kind="gpu-reset"))
    why = ar.refusal(req, "n1", remediating())
    assert why is not None and "no binding" in why


def test_a_request_copied_from_another_node_is_refused() -> None:
    other = wire(ar.issue(remediating("n2"), "gpu-reset"))
    why = ar.refusal(other, "n1", remediating("n1"))
    assert why is not None and "issued for node n2, not for n1" in why
    # Even with the node name edited, the other node's incident does not match this one's.
    mine = replace(
        remediating("n1"),
        incident=replace(
            remediating("n1").incident,  # type: ignore[arg-type]
            opened_at=OPENED + 60,
        ),
    )
    forged = replace(other, binding=replace(other.binding, node="n1"))  # type: ignore[arg-type]
    why = ar.refusal(forged, "n1", mine)
    assert why is not None and "another decision" in why


def test_a_gpu_reset_on_a_production_node_is_refused_whatever_it_carries() -> None:
    prod = NodeRecord.new("n1", at=0, state=NodeState.PRODUCTION)
    req = wire(ar.issue(remediating(), "gpu-reset"))
    why = ar.refusal(req, "n1", prod)
    assert why is not None and "issued in state remediating; the node is now production" in why
    forged = replace(req, binding=replace(req.binding, state="production"))  # type: ignore[arg-type]
    why = ar.refusal(forged, "n1", prod)
    assert why is not None and "no request is carried out on a node in production" in why
    assert ar.issue(prod, "gpu-reset") is None


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (remediating(ended=True), "asks nothing of the agent"),
        (
            remediating(step=Step.REBOOT),
            "asks nothing of the agent (the step in progress is reboot",
        ),
    ],
)
def test_a_gpu_reset_only_while_that_attempt_is_in_progress(
    record: NodeRecord, expected: str
) -> None:
    req = wire(ar.issue(remediating(), "gpu-reset"))
    why = ar.refusal(req, "n1", record)
    assert why is not None and expected in why


def test_kind_must_match_the_state() -> None:
    req = wire(ar.issue(verifying(), "checks", profile="verify"))
    gpu = replace(req, kind="gpu-reset")
    why = ar.refusal(gpu, "n1", verifying())
    assert why is not None and "gpu-reset request is not carried out in verifying" in why
    assert ar.issue(verifying(), "gpu-reset") is None
    assert ar.issue(remediating(), "checks", profile="verify") is None


def test_an_old_attempt_or_a_renamed_id_is_refused() -> None:
    old = wire(ar.issue(verifying(), "checks", profile="verify"))
    later = replace(
        verifying(),
        incident=replace(
            verifying().incident,
            checks_started_at=STARTED + 600,  # type: ignore[arg-type]
        ),
    )
    why = ar.refusal(old, "n1", later)
    assert why is not None and "another decision" in why
    renamed = replace(old, id="verify-1")  # a replay under a fresh id, to run it again
    why = ar.refusal(renamed, "n1", verifying())
    assert why is not None and "not the one the controller issued" in why


def test_no_record_or_a_record_of_another_node_refuses() -> None:
    req = wire(ar.issue(verifying(), "checks", profile="verify"))
    assert "no readable lifecycle record" in (ar.refusal(req, "n1", None) or "")
    assert "n2's, not n1's" in (ar.refusal(req, "n1", verifying("n2")) or "")


def test_malformed_binding_decodes_as_unbound() -> None:
    text = '{"id":"verify-1","kind":"checks","node":"n1","state":"verifying","started":"soon"}'
    req = c.decode_request(text)
    assert req is not None and req.binding is None
    text = (
        '{"id":"verify-1","kind":"checks","node":"n1","state":"verifying",'
        '"started":1,"incident":"x"}'
    )
    assert (c.decode_request(text) or c.AgentRequest("x", "checks")).binding is None


@given(st.text(max_size=300))
def test_decoding_never_raises(text: str) -> None:
    c.decode_request(text)


def test_a_refusal_is_not_a_result_the_controller_acts_on() -> None:
    cond = c.refusal("gpu-reset-1-3000", "the node has work")
    assert (cond.type, cond.status, cond.reason) == ("GpufleetRequest", "True", "Refused")
    assert cond.message == "gpu-reset-1-3000: refused: the node has work"
    assert c.decode_result(cond.status, cond.reason, cond.message) is None


# ------------------------------------------------------------------ work on the node


def pod(name: str, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    meta.update(extra.pop("meta", {}))
    return {"metadata": meta, "status": {"phase": extra.pop("phase", "Running")}}


RESET = c.AgentRequest(id="r", kind="gpu-reset")


def test_pods_that_count_as_work() -> None:
    assert pod_holds_node(pod("train"))
    assert pod_holds_node(pod("queued", phase="Pending"))
    assert not pod_holds_node(pod("agent", meta={"ownerReferences": [{"kind": "DaemonSet"}]}))
    assert not pod_holds_node(
        pod("static", meta={"annotations": {"kubernetes.io/config.mirror": "x"}})
    )
    assert not pod_holds_node(pod("done", phase="Succeeded"))
    assert not pod_holds_node(pod("failed", phase="Failed"))
    # a terminating pod still runs until its grace period ends
    assert pod_holds_node(pod("leaving", meta={"deletionTimestamp": "2026-01-01T00:00:00Z"}))


def test_an_empty_known_node_allows_the_request() -> None:
    ds = pod("agent", meta={"ownerReferences": [{"kind": "DaemonSet"}]})
    drained = SlurmWork(state="idle+DRAIN", jobs=(), incident=OPENED, at=1).to_annotation()
    assert ar.work_refusal(RESET, pods=[ds], slurm_work=drained, gpu_busy=False) is None
    assert ar.work_refusal(RESET, pods=[], slurm_work=None, gpu_busy=False) is None


@pytest.mark.parametrize(
    ("pods", "slurm", "busy", "expected"),
    [
        ([pod("train")], None, False, "1 pod(s) run on the node (ml/train)"),
        ([], '{"state":"allocated+DRAIN","jobs":["42"],"incident":null,"at":1}', False, "jobs 42"),
        ([], None, True, "processes run on the GPUs"),
        ([], None, None, "GPU processes could not be read"),
        (None, None, False, "pods on the node could not be listed"),
        ([], "{not json", False, "Slurm work report on the node is unreadable"),
    ],
)
def test_work_or_unknown_refuses(
    pods: list[dict[str, Any]] | None, slurm: str | None, busy: bool | None, expected: str
) -> None:
    why = ar.work_refusal(RESET, pods=pods, slurm_work=slurm, gpu_busy=busy)
    assert why is not None and expected in why
    checks = c.AgentRequest(id="v", kind="checks", profile="verify")
    assert ar.work_refusal(checks, pods=pods, slurm_work=slurm, gpu_busy=busy) == why
