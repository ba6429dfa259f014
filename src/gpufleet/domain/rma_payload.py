"""What an RMA ticket carries: the evidence bundle and the webhook payload, as typed models.

The payload's JSON schema is generated from :class:`TicketPayload`
(:func:`payload_schema`) and committed as ``docs/schemas/rma-ticket.schema.json``;
a unit test keeps the two equal and validates every payload the builders here
produce, so the receiver's contract cannot drift from the code.

The evidence bundle is what a person (or a vendor) needs to act on a node handed
off to them, gathered when the ticket is opened: the incident and its ladder
steps, the fault history, the agent's check results, the kernel log lines the
agent reported, the inventory (Machine serial, BMC endpoint) and the lemon score.
It is bounded (:data:`MAX_BUNDLE_BYTES`): what does not fit is cut, oldest first,
and the cut sections are named in ``truncated``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpufleet.domain import conditions, node_reports, rma
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.records import NodeRecord

SCHEMA_ID = "gpufleet.io/rma-ticket/v1"
"""The payload's ``schema`` field: receivers dispatch on it; a change that is not
backward compatible gets a new version."""
MAX_BUNDLE_BYTES = 64 * 1024
"""Largest evidence bundle (JSON): well under a ConfigMap's 1 MiB, small enough to
travel inline in the ticket."""
MAX_KERNEL_LINES = 100
MAX_LINE = 400
MAX_MESSAGE = 1000


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class NodeInfo(_Model):
    """The node as gpufleet knows it when the call is made."""

    name: str
    state: str
    reason: str
    since: str = Field(description="RFC 3339: when the node entered its state")
    pool: str


class MachineInfo(_Model):
    """The inventory: what a vendor asks for."""

    name: str | None = Field(default=None, description="The Machine object, if the node has one")
    serial: str | None = Field(default=None, description="Chassis serial number")
    bmc_endpoint: str | None = None
    hardware: str | None = Field(
        default=None, description="What the node's agent found (GPU model and count, HCAs)"
    )
    gpu_serials: list[str] = Field(
        default_factory=list, description="GPU serial numbers, where the agent reported them"
    )


class StepInfo(_Model):
    step: str
    attempt: int
    started_at: str
    ended_at: str | None = None
    outcome: str | None = None
    detail: str = ""


class IncidentInfo(_Model):
    key: str = Field(description="The fault (xid-79) or operator/maintenance")
    description: str
    opened_at: str
    plan: str | None = None
    steps: list[StepInfo] = Field(default_factory=list, description="The ladder steps tried")


class FaultInfo(_Model):
    key: str
    scope: str = Field(description="The component: gpu3, mlx5_0/1, node")
    at: str


class TransitionInfo(_Model):
    source: str
    target: str
    trigger: str
    reason: str
    at: str


class CheckInfo(_Model):
    source: Literal["condition", "agent-answer"]
    name: str = Field(description="The condition type, or the answered request's id")
    status: str = Field(description="True/False for a condition; passed/failed/refused")
    detail: str = ""


class LemonInfo(_Model):
    node: float = Field(description="Decayed, class-weighted fault score of the node")
    gpus: dict[str, float] = Field(default_factory=dict)


class Bundle(_Model):
    """The evidence bundle (stored in a ConfigMap, and carried by the opening call)."""

    collected_at: str
    node: NodeInfo
    machine: MachineInfo | None = None
    incident: IncidentInfo | None = None
    faults: list[FaultInfo] = Field(default_factory=list, description="Recent fault history")
    transitions: list[TransitionInfo] = Field(default_factory=list)
    checks: list[CheckInfo] = Field(default_factory=list)
    kernel_log: list[str] = Field(
        default_factory=list, description="The last kernel log lines the agent reported"
    )
    lemon: LemonInfo | None = None
    truncated: list[str] = Field(
        default_factory=list, description="Sections cut to fit the size bound (oldest first)"
    )


class EvidenceRef(_Model):
    """Where the bundle is kept: ``kubectl -n NS get configmap NAME -o jsonpath=...``."""

    kind: Literal["ConfigMap"] = "ConfigMap"
    namespace: str
    name: str
    key: str = "bundle.json"


class CloseInfo(_Model):
    by: str
    reason: str


class TicketPayload(_Model):
    """One webhook call: a ticket opened, updated (the node moved from triage to rma), or
    closed."""

    schema_: Literal["gpufleet.io/rma-ticket/v1"] = Field(
        default="gpufleet.io/rma-ticket/v1", alias="schema"
    )
    event: Literal["opened", "updated", "closed"]
    idempotency_key: str = Field(
        description="The same on every attempt of this call (also the Idempotency-Key header)"
    )
    ticket_key: str = Field(description="One per node and incident: <node>/<incident>/<opened>")
    ticket_id: str | None = Field(
        default=None, description="The receiver's id, when its answer to the opening named one"
    )
    attempt: int = Field(ge=1)
    sent_at: str
    node: NodeInfo
    machine: MachineInfo | None = None
    incident: IncidentInfo | None = None
    evidence: EvidenceRef | None = None
    bundle: Bundle | None = Field(default=None, description="The evidence, on opening only")
    close: CloseInfo | None = Field(default=None, description="On closing only")


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """An Event the node's agent posted (a fault it saw, with the kernel line)."""

    at: float
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """Everything read for a bundle: the record and what the Node, its Events and its
    Machine say."""

    record: NodeRecord
    conditions: Sequence[Mapping[str, Any]] = ()
    answer: node_reports.Answer | None = None
    agent_events: Sequence[AgentEvent] = ()
    machine: MachineInfo | None = None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def node_info(record: NodeRecord) -> NodeInfo:
    return NodeInfo(
        name=record.name,
        state=record.state.value,
        reason=_cut(record.reason, MAX_MESSAGE),
        since=rfc3339(record.since),
        pool=record.pool,
    )


def incident_info(record: NodeRecord) -> IncidentInfo | None:
    inc = record.incident
    if inc is None:
        return None
    steps = [
        StepInfo(
            step=a.step.value,
            attempt=a.attempt,
            started_at=rfc3339(a.started_at),
            ended_at=rfc3339(a.ended_at) if a.ended_at is not None else None,
            outcome=a.outcome.value if a.outcome is not None else None,
            detail=_cut(a.detail, MAX_MESSAGE),
        )
        for a in inc.tried
    ]
    return IncidentInfo(
        key=inc.key,
        description=_cut(inc.description, MAX_MESSAGE),
        opened_at=rfc3339(inc.opened_at),
        plan=inc.plan.value if inc.plan is not None else None,
        steps=steps,
    )


def _checks(facts: NodeFacts) -> list[CheckInfo]:
    out = [
        CheckInfo(
            source="condition",
            name=str(c.get("type")),
            status=str(c.get("status")),
            detail=_cut(f"{c.get('reason', '')}: {c.get('message', '')}", MAX_MESSAGE),
        )
        for c in facts.conditions
        if conditions.subsystem_of(str(c.get("type"))) is not None
    ]
    if facts.answer is not None:
        a = facts.answer
        out.append(CheckInfo(source="agent-answer", name=a.id, status=a.outcome, detail=a.detail))
    return out


def kernel_lines(facts: NodeFacts) -> list[str]:
    """The kernel log lines the agent reported, oldest first, each once: the raw lines
    carried by its problem conditions and by its fault Events."""
    found: list[tuple[float, str]] = []
    for c in facts.conditions:
        for fault in conditions.faults_of(
            facts.record.name,
            str(c.get("type")),
            str(c.get("status")),
            str(c.get("message", "")),
        ):
            if fault.evidence.message:
                found.append((fault.at, fault.evidence.message))
    found.extend((e.at, e.message) for e in facts.agent_events if e.message)
    seen: set[str] = set()
    lines: list[str] = []
    for at, text in sorted(found, key=lambda x: x[0]):
        line = _cut(f"{rfc3339(at)} {text.strip()}", MAX_LINE)
        if text.strip() and line not in seen:
            seen.add(line)
            lines.append(line)
    return lines


def collect(facts: NodeFacts, now: float) -> Bundle:
    """The evidence bundle, bounded (:func:`bounded`)."""
    r = facts.record
    lemon = r.lemon.now(now) if r.lemon is not None else None
    lines = kernel_lines(facts)
    truncated = [] if len(lines) <= MAX_KERNEL_LINES else ["kernelLog"]
    bundle = Bundle(
        collected_at=rfc3339(now),
        node=node_info(r),
        machine=facts.machine,
        incident=incident_info(r),
        faults=[FaultInfo(key=o.key, scope=o.scope, at=rfc3339(o.at)) for o in r.occurrences],
        transitions=[
            TransitionInfo(
                source=t.source.value,
                target=t.target.value,
                trigger=t.trigger.value,
                reason=_cut(t.reason, MAX_MESSAGE),
                at=rfc3339(t.at),
            )
            for t in r.history
        ],
        checks=_checks(facts),
        kernel_log=lines[-MAX_KERNEL_LINES:],
        lemon=(
            LemonInfo(
                node=round(lemon.node, 3), gpus={k: round(v, 3) for k, v in lemon.gpus.items()}
            )
            if lemon is not None
            else None
        ),
        truncated=truncated,
    )
    return bounded(bundle)


def bundle_json(bundle: Bundle) -> str:
    return json.dumps(bundle.model_dump(by_alias=True, mode="json"), separators=(",", ":"))


_SHRINKABLE = ("kernel_log", "faults", "transitions", "checks")
"""Sections cut (oldest entries first, halving) until the bundle fits, in this order."""


def bounded(bundle: Bundle, limit: int = MAX_BUNDLE_BYTES) -> Bundle:
    """The bundle cut to ``limit`` bytes of JSON, the cut sections named in ``truncated``."""
    for section in _SHRINKABLE:
        while len(bundle_json(bundle).encode()) > limit:
            items: list[Any] = getattr(bundle, section)
            if not items:
                break
            keep = items[len(items) // 2 + len(items) % 2 :] if len(items) > 1 else []
            alias = to_camel(section)
            marks = bundle.truncated if alias in bundle.truncated else [*bundle.truncated, alias]
            bundle = bundle.model_copy(update={section: keep, "truncated": marks})
    if len(bundle_json(bundle).encode()) > limit and bundle.incident is not None:
        steps = bundle.incident.steps[-3:]
        incident = bundle.incident.model_copy(update={"steps": steps})
        marks = [*bundle.truncated, "incident.steps"]
        bundle = bundle.model_copy(update={"incident": incident, "truncated": marks})
    return bundle


def opened(
    ticket: rma.Ticket,
    record: NodeRecord,
    *,
    bundle: Bundle,
    evidence: EvidenceRef | None,
    now: float,
) -> TicketPayload:
    """The payload that opens ``ticket`` (the attempt is the one just counted)."""
    return TicketPayload(
        event="opened",
        idempotency_key=rma.idempotency_key(ticket.key, "opened"),
        ticket_key=ticket.key,
        attempt=max(1, ticket.attempts),
        sent_at=rfc3339(now),
        node=node_info(record),
        machine=bundle.machine,
        incident=incident_info(record),
        evidence=evidence,
        bundle=bundle,
    )


def updated(
    ticket: rma.Ticket,
    record: NodeRecord,
    *,
    machine: MachineInfo | None,
    evidence: EvidenceRef | None,
    now: float,
) -> TicketPayload:
    """The payload that tells the receiver the node moved within the hand-off (its new state
    is ``node.state``; the idempotency key names it, so each move is delivered once)."""
    return TicketPayload(
        event="updated",
        idempotency_key=rma.idempotency_key(ticket.key, "updated", ticket.reported),
        ticket_key=ticket.key,
        ticket_id=ticket.ticket_id,
        attempt=max(1, ticket.attempts),
        sent_at=rfc3339(now),
        node=node_info(record),
        machine=machine,
        incident=incident_info(record),
        evidence=evidence,
    )


def closed(
    ticket: rma.Ticket,
    record: NodeRecord,
    *,
    machine: MachineInfo | None,
    evidence: EvidenceRef | None,
    now: float,
) -> TicketPayload:
    """The payload that closes ``ticket``."""
    return TicketPayload(
        event="closed",
        idempotency_key=rma.idempotency_key(ticket.key, "closed"),
        ticket_key=ticket.key,
        ticket_id=ticket.ticket_id,
        attempt=max(1, ticket.attempts),
        sent_at=rfc3339(now),
        node=node_info(record),
        machine=machine,
        incident=incident_info(record),
        evidence=evidence,
        close=CloseInfo(by=ticket.close_by or "gpufleet-controller", reason=ticket.close_reason),
    )


def payload_json(payload: TicketPayload) -> dict[str, Any]:
    """The JSON body of a call (absent optional fields are null, never missing)."""
    data: dict[str, Any] = payload.model_dump(by_alias=True, mode="json")
    return data


def payload_schema() -> dict[str, Any]:
    """The JSON schema of the payload (``docs/schemas/rma-ticket.schema.json``)."""
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://gpufleet.io/schemas/rma-ticket.schema.json",
        **TicketPayload.model_json_schema(by_alias=True, mode="serialization"),
    }
    schema["description"] = (
        "One call of gpufleet's RMA ticket webhook (docs/operations.md, 'RMA tickets'). "
        "POST, Content-Type application/json, header Idempotency-Key equal to "
        'idempotencyKey. Any 2xx acknowledges; an answer {"ticketId": "..."} names '
        "the receiver's ticket."
    )
    return schema


def evidence_ref(text: str | None) -> EvidenceRef | None:
    """The reference of a ticket record's ``namespace/name``."""
    if not text or "/" not in text:
        return None
    ns, name = text.split("/", 1)
    return EvidenceRef(namespace=ns, name=name)


def evidence_name(ticket_key: str, node: str) -> str:
    """The ConfigMap of a ticket's evidence: ``gpufleet-evidence-<node>-<hash>`` (a DNS
    name of at most 253 characters; the hash tells a node's incidents apart)."""
    digest = hashlib.sha256(ticket_key.encode()).hexdigest()[:10]
    return f"gpufleet-evidence-{node}"[:240] + f"-{digest}"
