"""The agent answers the lifecycle controller's requests (checks, GPU reset) once each."""

from __future__ import annotations

import asyncio

from gpufleet.domain import conditions
from gpufleet.health.agent import Agent

from .test_cli_and_agent import ListReporter, make_agent


def _serve(agent: Agent, annotation: str | None, answered: str | None = None) -> None:
    async def go() -> None:
        agent.offer_request(annotation, answered)
        await agent._serve_requests()

    asyncio.run(go())


def _result(rep: ListReporter) -> conditions.AgentResult | None:
    c = rep.conditions.get("GpufleetRequest")
    return None if c is None else conditions.decode_result(c.status, c.reason, c.message)


def test_verify_profile_passes_on_healthy_hardware() -> None:
    agent, hw, rep = make_agent()
    try:
        req = conditions.AgentRequest(id="inc1-verify-1", kind="checks", profile="verify")
        _serve(agent, req.encode())
        result = _result(rep)
        assert result is not None and result.id == "inc1-verify-1"
        assert result.passed, result.detail
        assert "checks passed" in result.detail
    finally:
        hw.close()


def test_verify_fails_and_names_the_failing_check() -> None:
    agent, hw, rep = make_agent()
    try:
        hw.inject("gemm-below-threshold,gpu=5")
        req = conditions.AgentRequest(id="inc2-verify-1", kind="checks", profile="verify")
        _serve(agent, req.encode())
        result = _result(rep)
        assert result is not None and not result.passed
        assert "gemm" in result.detail and "GPU 5" in result.detail
    finally:
        hw.close()


def test_a_request_is_answered_once() -> None:
    agent, hw, rep = make_agent()
    try:
        req = conditions.AgentRequest(id="r1", kind="checks", profile="verify")
        _serve(agent, req.encode())
        rep.conditions.clear()
        _serve(agent, req.encode())  # the same annotation seen again: not re-run
        assert _result(rep) is None
        # A fresh agent (after a restart) sees the answered id on the Node: not re-run either.
        fresh, hw2, rep2 = make_agent()
        try:
            _serve(fresh, req.encode(), answered="r1")
            assert _result(rep2) is None
        finally:
            hw2.close()
    finally:
        hw.close()


def test_unknown_profile_and_garbage_annotation() -> None:
    agent, hw, rep = make_agent()
    try:
        _serve(agent, '{"id": "r9", "kind": "checks", "profile": "marathon"}')
        result = _result(rep)
        assert result is not None and not result.passed
        assert "unknown check profile 'marathon'" in result.detail
        rep.conditions.clear()
        _serve(agent, "not json at all")
        assert _result(rep) is None
    finally:
        hw.close()


def test_gpu_reset_clears_a_gpu_fault_but_not_a_gpu_off_the_bus() -> None:
    agent, hw, rep = make_agent()
    try:
        hw.inject("ecc-uncorrectable,gpu=2")
        assert [g["ecc_uncorrected_volatile"] for g in hw.gpus() if g["index"] == 2] == [1]
        _serve(agent, conditions.AgentRequest(id="g1", kind="gpu-reset", gpu_index=2).encode())
        result = _result(rep)
        assert result is not None and result.passed and "GPU 2" in result.detail
        assert [g["ecc_uncorrected_volatile"] for g in hw.gpus() if g["index"] == 2] == [0]
        hw.inject("gpu-missing,gpu=3")
        _serve(agent, conditions.AgentRequest(id="g2", kind="gpu-reset", gpu_index=3).encode())
        result = _result(rep)
        assert result is not None and not result.passed
        assert "not on the bus" in result.detail
    finally:
        hw.close()


def test_agent_reports_its_hardware_for_the_inventory_check() -> None:
    from gpufleet.domain import inventory

    agent, hw, rep = make_agent()
    try:
        changed, events = agent.step(100.0)
        asyncio.run(agent.publish(changed, events, 100.0))
        cond = rep.conditions["GpufleetHardware"]
        observed = inventory.decode(cond.message)
        assert observed is not None
        assert (observed.gpu_count, observed.hca_count) == (8, 8)
        assert "H100" in observed.gpu_model
        hw.inject("gpu-missing,gpu=6")
        changed, events = agent.step(101.0)
        assert any(c.type == "GpufleetHardware" for c in changed)
        asyncio.run(agent.publish(changed, events, 101.0))
        later = inventory.decode(rep.conditions["GpufleetHardware"].message)
        assert later is not None and later.gpu_count == 7
        changed, _ = agent.step(102.0)  # unchanged: not written again
        assert not any(c.type == "GpufleetHardware" for c in changed)
    finally:
        hw.close()
