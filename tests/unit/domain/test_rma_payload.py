"""The evidence bundle and the ticket payloads: what they carry, and the size bound."""

from __future__ import annotations

import json

from gpufleet.domain import conditions, node_reports, rma
from gpufleet.domain import events as ev
from gpufleet.domain import rma_payload as p
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.policy import Policy, default_policy
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState

from .conftest import make_fleet, xid

KMSG = "NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus."


def _triaged_by_xid() -> NodeRecord:
    """XID 79 taken to triage by a rule (decide()), the lemon score counted."""
    spec = default_policy().model_dump(by_alias=True, mode="json")
    for rule in spec["rules"]:
        if rule["match"].get("xid") == 79:
            rule["action"] = "triage"
    f = make_fleet(4, Policy.model_validate(spec))
    f.send("n0", xid("n0", 79, at=1000.0, gpu=3), now=1000.0)
    f.send("n0", ev.DrainCompleted(), now=1010.0)
    record = f.records["n0"]
    assert record.state is NodeState.TRIAGE and record.incident is not None
    return record


def _condition(record: NodeRecord, lines: int = 1) -> dict[str, str]:
    faults = [
        FaultEvent(
            FaultKind.XID,
            record.name,
            at=1000.0 + i,
            xid=79,
            evidence=Evidence(gpu_index=3, message=f"{KMSG} #{i}"),
        )
        for i in range(lines)
    ]
    c = conditions.problem(Subsystem.PCIE, faults)
    return {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}


def _facts(record: NodeRecord, agent_events: tuple[p.AgentEvent, ...] = ()) -> p.NodeFacts:
    return p.NodeFacts(
        record=record,
        conditions=(_condition(record),),
        answer=node_reports.Answer("req-1", "failed", "dcgmi diag -r 2: PCIe replay errors"),
        agent_events=agent_events or (p.AgentEvent(1001.0, "Xid79", "GPU 3: " + KMSG),),
        machine=p.MachineInfo(
            name="n0", serial="SN-0042", bmc_endpoint="https://10.0.0.5", hardware="gpu-count=8"
        ),
    )


def test_the_bundle_carries_the_incident_history_checks_kernel_lines_inventory_and_lemon() -> None:
    record = _triaged_by_xid()
    b = p.collect(_facts(record), now=2000.0)
    assert b.node.name == "n0" and b.node.state == "triage"
    assert b.incident is not None and b.incident.key == "xid-79"
    assert [f.key for f in b.faults] == ["xid-79"] and b.faults[0].scope == "gpu3"
    assert [t.target for t in b.transitions][-2:] == ["draining", "triage"]
    assert any(c.source == "agent-answer" and "dcgmi" in c.detail for c in b.checks)
    assert any(c.source == "condition" and c.status == "True" for c in b.checks)
    assert len(b.kernel_log) == 2  # the condition's line and the Event's, once each
    assert all(KMSG in line for line in b.kernel_log)
    assert b.machine is not None and b.machine.serial == "SN-0042"
    assert b.lemon is not None and b.lemon.node > 0 and "gpu3" in b.lemon.gpus
    assert b.truncated == []


def test_the_same_kernel_line_reported_twice_is_kept_once() -> None:
    record = _triaged_by_xid()
    twice = (p.AgentEvent(1000.0, "Xid79", f"{KMSG} #0"),)
    lines = p.kernel_lines(_facts(record, agent_events=twice))
    assert len(lines) == 1


def test_a_long_history_is_cut_oldest_first_and_marked() -> None:
    record = _triaged_by_xid()
    many = tuple(p.AgentEvent(900.0 + i, "Xid79", f"{KMSG} line {i}") for i in range(500))
    b = p.collect(_facts(record, agent_events=many), now=2000.0)
    assert len(b.kernel_log) == p.MAX_KERNEL_LINES
    assert b.kernel_log[-1].endswith("line 499")  # the newest kept...
    assert not any(line.endswith("line 399") for line in b.kernel_log)  # ...the oldest cut
    assert "kernelLog" in b.truncated
    huge = tuple(p.AgentEvent(900.0 + i, "Xid79", "x" * 390 + str(i)) for i in range(100))
    small = p.bounded(p.collect(_facts(record, agent_events=huge), now=2000.0), limit=8000)
    assert len(p.bundle_json(small).encode()) <= 8000
    assert "kernelLog" in small.truncated
    assert 0 < len(small.kernel_log) < 101
    assert small.kernel_log[-1].endswith("#0")  # the newest (the condition's, at 1000) kept


def test_the_opening_payload_references_the_evidence_and_carries_it() -> None:
    record = _triaged_by_xid()
    bundle = p.collect(_facts(record), now=2000.0)
    key = rma.ticket_key(record)
    assert key is not None
    t = rma.attempted(rma.Ticket(key=key, state=rma.TicketState.OPENING), 2000.0, base_s=5, max_s=9)
    ref = p.EvidenceRef(namespace="gpufleet-evidence", name=p.evidence_name(key, "n0"))
    body = p.payload_json(p.opened(t, record, bundle=bundle, evidence=ref, now=2000.0))
    assert body["schema"] == p.SCHEMA_ID and body["event"] == "opened"
    assert body["idempotencyKey"] == f"{key}#opened" and body["attempt"] == 1
    assert body["evidence"] == {
        "kind": "ConfigMap",
        "namespace": "gpufleet-evidence",
        "name": ref.name,
        "key": "bundle.json",
    }
    assert body["bundle"]["machine"]["serial"] == "SN-0042"
    assert body["close"] is None
    json.dumps(body)  # plain JSON


def test_the_closing_payload_names_the_receivers_ticket_and_who_closed_it() -> None:
    record = _triaged_by_xid()
    key = rma.ticket_key(record)
    assert key is not None
    t = rma.Ticket(
        key=key,
        state=rma.TicketState.CLOSING,
        attempts=2,
        ticket_id="T-7",
        close_by="alice",
        close_reason="board replaced",
    )
    body = p.payload_json(p.closed(t, record, machine=None, evidence=None, now=3000.0))
    assert body["event"] == "closed" and body["ticketId"] == "T-7" and body["attempt"] == 2
    assert body["close"] == {"by": "alice", "reason": "board replaced"}
    assert body["bundle"] is None and body["idempotencyKey"] == f"{key}#closed"


def test_evidence_names_are_dns_names_that_tell_incidents_apart() -> None:
    a = p.evidence_name("n0/xid-79/1", "n0")
    b = p.evidence_name("n0/xid-79/2", "n0")
    assert a != b and a.startswith("gpufleet-evidence-n0-")
    long = p.evidence_name("k", "n" * 253)
    assert len(long) <= 253
    assert p.evidence_ref("ns/" + a) == p.EvidenceRef(namespace="ns", name=a)
    assert p.evidence_ref("no-slash") is None
