"""What the agent reports about its Node that is data, not health: Node annotations.

Node conditions are for health (Node-Problem-Detector's convention: one per
problem, ``True`` = problem), which is what the agent's problem conditions are.
Two things the agent used to put in conditions are data, and travel in
annotations instead (decision 0100):

- ``gpufleet.io/hardware``: the hardware it observes (GPU model and count, HCA
  count; :mod:`gpufleet.domain.inventory`'s encoding), compared with the Machine
  inventory when the node joins;
- ``gpufleet.io/agent-result``: its answer to the controller's last request
  (``gpufleet.io/agent-request``), as JSON: ``{"id", "outcome", "detail"}``,
  outcome ``passed``, ``failed`` or ``refused``.

The agent writes them through the Node's status subresource (the only Node write
its RBAC has; admission lets it change these two annotations and no other
metadata). Readers fall back to the old conditions (``GpufleetHardware``,
``GpufleetRequest``) so a node whose agent is not upgraded yet keeps working; the
agent removes the old conditions with its first write. Decoding never raises:
anything malformed is "no report" (fail closed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpufleet.domain import inventory, well_known
from gpufleet.domain.conditions import _ID, AgentResult, decode_result

ANNOTATION_HARDWARE = well_known.ANNOTATION_HARDWARE
ANNOTATION_AGENT_RESULT = well_known.ANNOTATION_AGENT_RESULT
AGENT_ANNOTATIONS = (ANNOTATION_HARDWARE, ANNOTATION_AGENT_RESULT)
"""The only metadata the agent may change (its admission policy names the same keys)."""
LEGACY_CONDITIONS = (well_known.CONDITION_HARDWARE, well_known.CONDITION_REQUEST)
"""Conditions that carried this data before; read as a fallback, removed by the agent."""

Outcome = Literal["passed", "failed", "refused"]
MAX_DETAIL = 1024


@dataclass(frozen=True, slots=True)
class AnnotationReport:
    """One Node annotation as the agent writes it."""

    key: str
    value: str


@dataclass(frozen=True, slots=True)
class Answer:
    """The agent's answer to a request, whatever it was (a refusal included)."""

    id: str
    outcome: Outcome
    detail: str = ""

    def result(self) -> AgentResult | None:
        """The result the controller acts on; None for a refusal (it waits: decision 0074)."""
        if self.outcome == "refused":
            return None
        return AgentResult(id=self.id, passed=self.outcome == "passed", detail=self.detail)


def hardware(hw: inventory.Hardware) -> AnnotationReport:
    """The ``gpufleet.io/hardware`` annotation of what the agent found."""
    return AnnotationReport(ANNOTATION_HARDWARE, inventory.encode(hw))


def answer(request_id: str, outcome: Outcome, detail: str = "") -> AnnotationReport:
    """The ``gpufleet.io/agent-result`` annotation of an answer."""
    doc = {"id": request_id, "outcome": outcome, "detail": detail[:MAX_DETAIL]}
    return AnnotationReport(ANNOTATION_AGENT_RESULT, json.dumps(doc, separators=(",", ":")))


def result(r: AgentResult) -> AnnotationReport:
    """The annotation of a request carried out."""
    return answer(r.id, "passed" if r.passed else "failed", r.detail)


def refusal(request_id: str, why: str) -> AnnotationReport:
    """The annotation of a refused request (not a failure: the controller waits)."""
    return answer(request_id, "refused", f"refused: {why}")


def _annotations(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return (node.get("metadata") or {}).get("annotations") or {}


def _conditions(node: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return (node.get("status") or {}).get("conditions") or []


def decode_answer(text: str) -> Answer | None:
    """An ``agent-result`` annotation's answer; None if malformed."""
    try:
        doc = json.loads(text)
        rid, outcome, detail = doc["id"], doc["outcome"], doc.get("detail", "")
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(rid, str) or not _ID.match(rid) or not isinstance(detail, str):
        return None
    if outcome not in ("passed", "failed", "refused"):
        return None
    return Answer(id=rid, outcome=outcome, detail=detail)


def answer_of(node: Mapping[str, Any]) -> Answer | None:
    """The agent's latest answer on ``node``: the annotation, else the old condition."""
    text = _annotations(node).get(ANNOTATION_AGENT_RESULT)
    if isinstance(text, str):
        return decode_answer(text)
    for c in _conditions(node):
        if c.get("type") != well_known.CONDITION_REQUEST:
            continue
        status, reason, message = (str(c.get(k, "")) for k in ("status", "reason", "message"))
        old = decode_result(status, reason, message)
        if old is not None:
            return Answer(old.id, "passed" if old.passed else "failed", old.detail)
        rid, _, rest = message.partition(": ")
        if reason == "Refused" and _ID.match(rid):
            return Answer(rid, "refused", rest)
    return None


def result_of(node: Mapping[str, Any]) -> AgentResult | None:
    """The result of a request carried out on ``node`` (None: none, or refused)."""
    found = answer_of(node)
    return found.result() if found is not None else None


def hardware_of(node: Mapping[str, Any]) -> inventory.Hardware | None:
    """The hardware the node's agent reported: the annotation, else the old condition."""
    text = _annotations(node).get(ANNOTATION_HARDWARE)
    if isinstance(text, str):
        return inventory.decode(text)
    return inventory.observed_on(_conditions(node))
