from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import conditions as c
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem


def test_problem_condition_round_trips_every_occurrence() -> None:
    faults = [
        FaultEvent(FaultKind.XID, "n1", at=10.5 + i, xid=13, evidence=Evidence(gpu_index=2))
        for i in range(3)
    ]
    line = "NVRM: Xid (PCI:0000:1b:00): 79, GPU has fallen off the bus."
    evidence = Evidence(gpu_index=3, pci_bus_id="0000:1b:00.0", counters={"x": 1.0}, message=line)
    faults.append(FaultEvent(FaultKind.XID, "n1", at=20.0, xid=79, evidence=evidence))
    report = c.problem(Subsystem.GPU, faults)
    assert (report.type, report.status, report.reason) == ("GpuProblem", "True", "Xid79")
    assert report.message.startswith("xid79 gpu3: GPU 3; PCI 0000:1b:00.0")
    assert "(4 occurrences)" in report.message
    assert c.faults_of("n1", report.type, report.status, report.message) == faults


def test_reason_is_camel_case() -> None:
    assert c.reason_of(FaultEvent(FaultKind.IB_PORT_DOWN, "n", at=0)) == "IbPortDown"
    assert c.reason_of(FaultEvent(FaultKind.XID, "n", at=0, xid=48)) == "Xid48"


def test_healthy_and_foreign_conditions_carry_no_faults() -> None:
    h = c.healthy(Subsystem.INFINIBAND)
    assert (h.type, h.status) == ("InfinibandProblem", "False")
    assert c.faults_of("n", h.type, h.status, h.message) == []
    assert c.faults_of("n", "MemoryPressure", "True", "x | evidence: []") == []
    assert c.subsystem_of("PcieProblem") is Subsystem.PCIE
    assert c.subsystem_of("Ready") is None


@pytest.mark.parametrize(
    "message",
    [
        "",
        "no marker at all",
        "x | evidence: not json",
        "x | evidence: {}",
        'x | evidence: [{"kind": "gremlin", "at": 1}]',
        'x | evidence: [{"kind": "xid", "at": 1}]',
        'x | evidence: [{"kind": "xid", "at": "soon", "xid": 79}]',
        'x | evidence: [{"kind": "ib-port-down"}]',
    ],
)
def test_malformed_messages_decode_to_nothing(message: str) -> None:
    assert c.faults_of("n", "GpuProblem", "True", message) == []


@given(st.text(max_size=200))
def test_decoding_never_raises(message: str) -> None:
    c.faults_of("n", "GpuProblem", "True", message)
    c.decode_request(message)
    c.decode_result("True", "Failed", message)


def test_requests_and_results_round_trip() -> None:
    req = c.AgentRequest(id="inc-12-verify-1", kind="checks", profile="verify")
    assert c.decode_request(req.encode()) == req
    reset = c.AgentRequest(id="inc-12-gpu-reset-1", kind="gpu-reset", gpu_index=3)
    assert c.decode_request(reset.encode()) == reset
    assert c.decode_request('{"id": "x y", "kind": "checks"}') is None
    assert c.decode_request('{"id": "a", "kind": "reboot"}') is None
    assert c.decode_request(None) is None
    ok = c.AgentResult(id="inc-12-verify-1", passed=True, detail="8/8 GPUs pass")
    cond = ok.condition()
    assert (cond.type, cond.status, cond.reason) == ("GpufleetRequest", "False", "Passed")
    assert c.decode_result(cond.status, cond.reason, cond.message) == ok
    bad = c.AgentResult(id="r1", passed=False, detail="GEMM 410 < 600 TFLOP/s on GPU 5")
    cond = bad.condition()
    assert c.decode_result(cond.status, cond.reason, cond.message) == bad
    assert c.decode_result("True", "Whatever", "r1: x") is None
