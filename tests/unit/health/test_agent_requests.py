"""The agent answers the lifecycle controller's requests (checks, GPU reset) once each,
and only those bound to its node's current decision, on a node without work (0074)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

import pytest

from gpufleet.domain import agent_requests, conditions, node_reports, well_known
from gpufleet.domain.emptiness import SlurmWork
from gpufleet.domain.ladder import Step
from gpufleet.domain.records import Incident, NodeRecord, StepAttempt, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.health.agent import Agent
from gpufleet.health.hardware import HardwareError

from .test_cli_and_agent import ListReporter, make_agent


class NodeReporter(ListReporter):
    """The agent's Kubernetes port, in memory: its Node (record, Slurm report), pods, Events."""

    def __init__(self, record: NodeRecord | None) -> None:
        super().__init__()
        self.record = record
        self.slurm_work: str | None = None
        self.pods: list[dict[str, Any]] = []
        self.pods_error: Exception | None = None
        self.node_events: list[tuple[str, str]] = []

    async def node_object(self) -> dict[str, Any]:
        ann: dict[str, str] = {}
        if self.record is not None:
            ann[well_known.ANNOTATION_RECORD] = record_to_json(self.record)
        if self.slurm_work is not None:
            ann[well_known.ANNOTATION_SLURM_WORK] = self.slurm_work
        return {"metadata": {"name": "n1", "annotations": ann}}

    async def pods_on_node(self) -> list[dict[str, Any]]:
        if self.pods_error is not None:
            raise self.pods_error
        return self.pods

    async def node_event(
        self,
        *,
        reason: str,
        message: str,
        now: float,
        first: float | None = None,
        warning: bool = True,
    ) -> None:
        self.node_events.append((reason, message))


def remediating(node: str = "n1", gpu: int = 2) -> NodeRecord:
    inc = Incident(
        key="xid-48",
        description="x",
        opened_at=1000.5,
        plan=Step.GPU_RESET,
        current=Step.GPU_RESET,
        tried=(StepAttempt(Step.GPU_RESET, 1, 1010.25),),
    )
    return replace(NodeRecord.new(node, at=0, state=NodeState.REMEDIATING), incident=inc)


def verifying(started: float = 2000.125) -> NodeRecord:
    inc = Incident(
        key="xid-48",
        description="x",
        opened_at=1000.5,
        plan=Step.GPU_RESET,
        checks_started_at=started,
    )
    return replace(NodeRecord.new("n1", at=0, state=NodeState.VERIFYING), incident=inc)


def agent_for(record: NodeRecord | None) -> tuple[Agent, Any, NodeReporter]:
    agent, hw, _ = make_agent()
    rep = NodeReporter(record)
    agent.reporter = rep
    return agent, hw, rep


def _serve(agent: Agent, annotation: str | None, answered: str | None = None) -> None:
    async def go() -> None:
        agent.offer_request(annotation, answered)
        await agent._serve_requests()

    asyncio.run(go())


@dataclass(frozen=True)
class Answered:
    """The agent's answer annotation, read as ``reason`` and ``message``."""

    reason: str
    message: str


def _result(rep: ListReporter) -> Answered | None:
    text = rep.annotations.get(node_reports.ANNOTATION_AGENT_RESULT)
    found = node_reports.decode_answer(text) if text is not None else None
    if found is None:
        return None
    return Answered(found.outcome.capitalize(), f"{found.id}: {found.detail}")


def _passed(rep: ListReporter) -> conditions.AgentResult | None:
    text = rep.annotations.get(node_reports.ANNOTATION_AGENT_RESULT)
    found = node_reports.decode_answer(text) if text is not None else None
    return None if found is None else found.result()


def issue(record: NodeRecord, kind: conditions.RequestKind, **kw: Any) -> str:
    req = agent_requests.issue(record, kind, **kw)
    assert req is not None
    return req.encode()


def refused(agent: Agent, kind: str) -> float:
    assert agent.metrics is not None
    value = agent.metrics.registry.get_sample_value(
        "gpufleet_agent_requests_total", {"node": "n1", "kind": kind, "outcome": "refused"}
    )
    return value or 0.0


# --------------------------------------------------------------- carried out


def test_verify_profile_passes_on_healthy_hardware() -> None:
    agent, hw, rep = agent_for(verifying())
    try:
        _serve(agent, issue(verifying(), "checks", profile="verify"))
        result = _passed(rep)
        assert result is not None and result.id == "verify-2000125"
        assert result.passed, result.detail
        assert "checks passed" in result.detail
    finally:
        hw.close()


def test_verify_fails_and_names_the_failing_check() -> None:
    agent, hw, rep = agent_for(verifying())
    try:
        hw.inject("gemm-below-threshold,gpu=5")
        _serve(agent, issue(verifying(), "checks", profile="verify"))
        result = _passed(rep)
        assert result is not None and not result.passed
        assert "gemm" in result.detail and "GPU 5" in result.detail
    finally:
        hw.close()


def test_a_request_is_answered_once() -> None:
    agent, hw, rep = agent_for(verifying())
    try:
        annotation = issue(verifying(), "checks", profile="verify")
        _serve(agent, annotation)
        rep.annotations.clear()
        _serve(agent, annotation)  # the same annotation seen again: not re-run
        assert _result(rep) is None
        # A fresh agent (after a restart) sees the answered id on the Node: not re-run either.
        fresh, hw2, rep2 = agent_for(verifying())
        try:
            _serve(fresh, annotation, answered="verify-2000125")
            assert _result(rep2) is None
        finally:
            hw2.close()
    finally:
        hw.close()


def test_unknown_profile_and_garbage_annotation() -> None:
    agent, hw, rep = agent_for(verifying())
    try:
        _serve(agent, issue(verifying(), "checks", profile="marathon"))
        result = _passed(rep)
        assert result is not None and not result.passed
        assert "unknown check profile 'marathon'" in result.detail
        rep.annotations.clear()
        _serve(agent, "not json at all")
        assert _result(rep) is None
    finally:
        hw.close()


def test_gpu_reset_clears_a_gpu_fault_but_not_a_gpu_off_the_bus() -> None:
    agent, hw, rep = agent_for(remediating())
    try:
        hw.inject("ecc-uncorrectable,gpu=2")
        assert [g["ecc_uncorrected_volatile"] for g in hw.gpus() if g["index"] == 2] == [1]
        _serve(agent, issue(remediating(), "gpu-reset", gpu_index=2))
        result = _passed(rep)
        assert result is not None and result.passed and "GPU 2" in result.detail
        assert [g["ecc_uncorrected_volatile"] for g in hw.gpus() if g["index"] == 2] == [0]
        assert hw.resets == 1
        later = replace(
            remediating(),
            incident=replace(
                remediating().incident,  # type: ignore[arg-type]
                tried=(StepAttempt(Step.GPU_RESET, 2, 1020.0),),
            ),
        )
        rep.record = later
        hw.inject("gpu-missing,gpu=3")
        _serve(agent, issue(later, "gpu-reset", gpu_index=3))
        result = _passed(rep)
        assert result is not None and not result.passed
        assert "not on the bus" in result.detail
    finally:
        hw.close()


# ------------------------------------------------------------------- refused


def test_an_unbound_gpu_reset_on_a_production_node_is_refused_and_reported() -> None:
    agent, hw, rep = agent_for(NodeRecord.new("n1", at=0, state=NodeState.PRODUCTION))
    try:
        hw.inject("busy")  # a job runs; the request is refused before that even matters
        _serve(agent, '{"id":"please-reset","kind":"gpu-reset","gpu_index":0}')
        assert hw.resets == 0
        cond = _result(rep)
        assert cond is not None and cond.reason == "Refused"
        assert cond.message.startswith("please-reset: refused: the request carries no binding")
        assert _passed(rep) is None  # not a result the controller acts on
        assert [r for r, _ in rep.node_events] == ["RequestRefused"]
        assert refused(agent, "gpu-reset") == 1
    finally:
        hw.close()


def test_a_request_copied_from_another_node_is_refused() -> None:
    agent, hw, rep = agent_for(remediating("n1"))
    try:
        _serve(agent, issue(remediating("n2"), "gpu-reset"))
        assert hw.resets == 0
        cond = _result(rep)
        assert cond is not None and "issued for node n2, not for n1" in cond.message
    finally:
        hw.close()


def test_no_record_or_no_node_access_refuses() -> None:
    agent, hw, rep = agent_for(None)
    try:
        _serve(agent, issue(remediating(), "gpu-reset"))
        assert hw.resets == 0
        assert "no readable lifecycle record" in (_result(rep) or rep).message  # type: ignore[union-attr]
    finally:
        hw.close()
    plain, hw2, lrep = make_agent()  # a reporter that cannot read the Node
    try:
        _serve(plain, issue(remediating(), "gpu-reset"))
        assert hw2.resets == 0
        assert "cannot read its Node" in (_result(lrep) or lrep).message  # type: ignore[union-attr]
    finally:
        hw2.close()


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (
            lambda r, hw: r.pods.append(
                {"metadata": {"name": "train", "namespace": "ml"}, "status": {"phase": "Running"}}
            ),
            "1 pod(s) run on the node (ml/train)",
        ),
        (
            lambda r, hw: setattr(
                r, "slurm_work", SlurmWork("mixed+DRAIN", ("77",), 1000.5, 1).to_annotation()
            ),
            "jobs 77",
        ),
        (lambda r, hw: hw.inject("busy"), "processes run on the GPUs"),
        (
            lambda r, hw: setattr(r, "pods_error", RuntimeError("apiserver down")),
            "pods on the node could not be listed",
        ),
    ],
)
def test_a_legitimate_request_on_a_node_with_work_is_refused(setup: Any, expected: str) -> None:
    agent, hw, rep = agent_for(remediating())
    try:
        setup(rep, hw)
        _serve(agent, issue(remediating(), "gpu-reset"))
        assert hw.resets == 0
        cond = _result(rep)
        assert cond is not None and cond.reason == "Refused"
        assert "has work" in cond.message and expected in cond.message
        assert rep.node_events and rep.node_events[-1][0] == "RequestRefused"
    finally:
        hw.close()


def test_a_request_refused_for_work_runs_once_the_node_is_empty() -> None:
    agent, hw, rep = agent_for(remediating())
    agent.settings.request_retry_s = 10.0
    now = [100.0]
    agent.clock = lambda: now[0]
    try:
        rep.pods.append({"metadata": {"name": "train", "namespace": "ml"}, "status": {}})
        _serve(agent, issue(remediating(), "gpu-reset"))
        assert hw.resets == 0
        now[0] = 105.0
        agent._retry_due(now[0])
        asyncio.run(agent._serve_requests())
        assert hw.resets == 0  # not due yet
        rep.pods.clear()
        now[0] = 111.0
        agent._retry_due(now[0])
        asyncio.run(agent._serve_requests())
        assert hw.resets == 1
        result = _passed(rep)
        assert result is not None and result.passed
        assert len(rep.node_events) == 1  # one Event for the refusal, not one per retry
    finally:
        hw.close()


def test_a_refused_forged_request_is_not_judged_again() -> None:
    agent, hw, rep = agent_for(NodeRecord.new("n1", at=0, state=NodeState.PRODUCTION))
    try:
        annotation = '{"id":"x1","kind":"gpu-reset"}'
        _serve(agent, annotation)
        _serve(agent, annotation)
        agent._retry_due(1e12)
        asyncio.run(agent._serve_requests())
        assert len(rep.node_events) == 1 and hw.resets == 0
    finally:
        hw.close()


# ---------------------------------------------------------- unreadable GPUs


class _Unreadable:
    def busy(self) -> bool:
        raise HardwareError("NVML: GPU 3: running processes unreadable: NVML_ERROR_UNKNOWN")


def test_unreadable_gpu_processes_count_as_busy() -> None:
    agent, hw, rep = agent_for(remediating())
    try:
        hw.busy = _Unreadable().busy  # type: ignore[method-assign]
        assert agent.gpu_busy() is None
        agent.settings.active_every_s = 1.0
        assert not agent._active_due(1e9)  # no scheduled stress check on a node we cannot read
        _serve(agent, issue(remediating(), "gpu-reset"))
        assert hw.resets == 0
        assert "GPU processes could not be read" in (_result(rep) or rep).message  # type: ignore[union-attr]
    finally:
        hw.close()


def test_real_backend_does_not_call_an_unreadable_nvml_idle() -> None:
    from gpufleet.health import _nvml
    from gpufleet.health.backend_real import RealHardware

    class Failed(Exception):
        value = 999

    class FakeNv:
        NVMLError = Failed

        def __init__(self, fail: str) -> None:
            self.fail = fail

        def nvmlDeviceGetCount(self) -> int:
            if self.fail == "count":
                raise Failed("driver gone")
            return 2

        def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
            return i

        def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[int]:
            if self.fail == "procs" and h == 1:
                raise Failed("unknown")
            return [4242] if self.fail == "busy" and h == 1 else []

    def session(fail: str) -> RealHardware:
        nvml = _nvml.Nvml.__new__(_nvml.Nvml)
        nvml._nv = FakeNv(fail)
        hw = RealHardware(kmsg_path="/nonexistent")
        hw._nvml = nvml
        return hw

    assert session("none").busy() is False
    assert session("busy").busy() is True
    for fail in ("count", "procs"):
        with pytest.raises(HardwareError):
            session(fail).busy()
