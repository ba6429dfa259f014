"""The committed RMA ticket schema is the code's, and every payload the code builds
validates against the committed file (read as JSON, checked by a small JSON-schema
validator here, independent of the pydantic models that generate both)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.api import rma_ticket
from gpufleet.domain import events as ev
from gpufleet.domain import node_reports, rma
from gpufleet.domain import rma_payload as p
from gpufleet.domain.decide import decide
from gpufleet.domain.policy import default_policy
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.states import NodeState

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / rma_ticket.PATH).read_text())


def test_the_committed_schema_is_generated_from_the_payload_model() -> None:
    committed = (ROOT / rma_ticket.PATH).read_text()
    assert committed == rma_ticket.render(), (
        "docs/schemas/rma-ticket.schema.json is stale: run python -m gpufleet.api.rma_ticket"
    )


# --------------------------------------------------------------- a small validator
# The subset of JSON Schema (2020-12) the generated schema uses: type, properties,
# required, additionalProperties, $ref into $defs, anyOf, const, enum, items, minimum,
# additionalProperties as a schema (maps).

_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def problems(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        return problems(value, SCHEMA["$defs"][name], path)
    if "anyOf" in schema:
        options = [problems(value, s, path) for s in schema["anyOf"]]
        return [] if any(not o for o in options) else [f"{path}: matches no anyOf option"]
    out: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        expected = _TYPES[kind]
        bad_bool = kind in ("integer", "number") and isinstance(value, bool)
        if not isinstance(value, expected) or bad_bool:
            return [f"{path}: {type(value).__name__} is not {kind}"]
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"]:
        out.append(f"{path}: {value} < {schema['minimum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                out.append(f"{path}: {key} missing")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in props:
                out += problems(item, props[key], f"{path}.{key}")
            elif extra is False:
                out.append(f"{path}: unexpected {key}")
            elif isinstance(extra, dict):
                out += problems(item, extra, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += problems(item, schema["items"], f"{path}[{i}]")
    return out


# --------------------------------------------------------------- payloads


def _record() -> NodeRecord:
    """A node held for triage by an operator, then sent to rma (through decide())."""
    r = NodeRecord.new("gpu-node-0007", at=0.0, state=NodeState.PRODUCTION)
    policy = default_policy()
    for event, now in (
        (ev.OperatorTriage("by alice: NCCL hangs"), 10.0),
        (ev.DrainCompleted(), 20.0),
        (ev.OperatorRMA("by alice: vendor case 4711"), 30.0),
    ):
        r = decide(r, FleetView.of([r]), event, policy, now).record
    assert r.state is NodeState.RMA
    return r


def _payloads() -> list[dict[str, Any]]:
    record = _record()
    key = rma.ticket_key(record)
    assert key is not None
    facts = p.NodeFacts(
        record=record,
        answer=node_reports.Answer("abc123", "failed", "hbm bandwidth 1.1 TB/s < 2.8"),
        agent_events=(p.AgentEvent(5.0, "Xid79", "NVRM: Xid 79 ..."),),
        machine=p.MachineInfo(name="gpu-node-0007", serial="SN7", bmc_endpoint="https://bmc7"),
    )
    bundle = p.collect(facts, now=40.0)
    ticket = rma.attempted(
        rma.Ticket(key=key, state=rma.TicketState.OPENING), 40.0, base_s=5, max_s=60
    )
    ref = p.EvidenceRef(namespace="gpufleet-evidence", name=p.evidence_name(key, record.name))
    opening = p.opened(ticket, record, bundle=bundle, evidence=ref, now=40.0)
    bare = p.opened(
        ticket, record, bundle=p.collect(p.NodeFacts(record=record), 40.0), evidence=None, now=40.0
    )
    closing_ticket = rma.advance(
        rma.delivered(ticket, 41.0, "T-1"), record, rma.CloseRequest("alice", "replaced", 50.0)
    )
    assert closing_ticket is not None
    closing = p.closed(
        rma.attempted(closing_ticket, 50.0, base_s=5, max_s=60),
        record,
        machine=bundle.machine,
        evidence=ref,
        now=50.0,
    )
    update = rma.attempted(
        rma.Ticket(key=key, state=rma.TicketState.UPDATING, ticket_id="T-1", sent=True),
        45.0,
        base_s=5,
        max_s=60,
        state="rma",
    )
    moved = p.updated(update, record, machine=bundle.machine, evidence=ref, now=45.0)
    assert moved.idempotency_key == f"{key}#updated-rma"
    return [p.payload_json(x) for x in (opening, bare, closing, moved)]


@pytest.mark.parametrize("index", [0, 1, 2, 3], ids=["opened", "opened-bare", "closed", "updated"])
def test_every_payload_validates_against_the_committed_schema(index: int) -> None:
    payload = json.loads(json.dumps(_payloads()[index]))  # as the receiver reads it
    assert problems(payload, SCHEMA) == []


def test_the_validator_refuses_what_the_schema_forbids() -> None:
    payload = _payloads()[0]
    wrong = {**payload, "event": "reopened", "surprise": 1, "attempt": 0}
    del wrong["node"]
    found = problems(wrong, SCHEMA)
    assert any("event" in f for f in found)
    assert any("unexpected surprise" in f for f in found)
    assert any("node missing" in f for f in found)
    assert any("attempt" in f for f in found)
    bad_bundle = {**payload, "bundle": {**payload["bundle"], "kernelLog": [1]}}
    assert problems(bad_bundle, SCHEMA)
