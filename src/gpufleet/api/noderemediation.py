"""``NodeRemediation``: one incident on one node, for people (``kubectl get nrem``).

The Node's record is what the controller decides from; this object shows the
same facts: the fault, the planned ladder, every step tried with its times
and outcome, and where it ended.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.api.names import NODE_REMEDIATION
from gpufleet.api.schema import AGE, CONDITIONS, Json, column, crd, structural

NAMES = NODE_REMEDIATION
KIND = NAMES.kind
PLURAL = NAMES.plural

Phase = Literal["Draining", "Remediating", "Verifying", "Succeeded", "Escalated"]
PHASES: tuple[Phase, ...] = ("Draining", "Remediating", "Verifying", "Succeeded", "Escalated")


class NodeRemediationSpec(BaseModel):
    """What the incident is about; set once, when the incident opens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str = Field(description="The Node being repaired.")
    fault: str = Field(description="Fault key (xid-79, ib-port-down, ...).")
    description: str = Field(default="", description="The fault in words, with its evidence.")
    plan: str = Field(default="", description="The rung the ladder starts at.")
    ladder: list[str] = Field(
        default_factory=list,
        description="The escalation path from the plan, ending in triage or rma.",
    )


def _field(type_: str, description: str, *, time: bool = False, null: bool = False) -> Json:
    out: Json = {"type": type_}
    if time:
        out["format"] = "date-time"
    if null:
        out["nullable"] = True
    out["description"] = description
    return out


_STEP_STATUS: Json = {
    "type": "object",
    "properties": {
        "step": _field(
            "string", "The rung (gpu-reset, reboot, power-cycle, reimage, verify, ...)."
        ),
        "attempt": _field("integer", "Which attempt of this rung, from 1."),
        "startedAt": _field("string", "When the attempt began.", time=True),
        "endedAt": _field("string", "When it ended; null: still running.", time=True, null=True),
        "outcome": _field(
            "string",
            "How it ended: succeeded, failed, timed-out or refused (the node was not "
            "empty); null: running.",
            null=True,
        ),
        "detail": _field("string", "What happened, in words."),
    },
}

STATUS_SCHEMA: Json = {
    "type": "object",
    "description": "Written by the lifecycle controller as the incident goes on.",
    "properties": {
        "phase": {
            **_field(
                "string",
                "Draining, Remediating, Verifying, then Succeeded (the node "
                "returned to production) or Escalated (triage or rma).",
            ),
            "enum": list(PHASES),
        },
        "currentStep": _field("string", "The rung running now; null: none.", null=True),
        "steps": {
            **_field("array", "Every step tried, in order, with its times and outcome."),
            "items": _STEP_STATUS,
        },
        "startedAt": _field("string", "When the incident opened.", time=True),
        "completedAt": _field("string", "When it ended; null: open.", time=True, null=True),
        "outcome": _field(
            "string",
            "How it ended: repaired, or the state it ended in (triage, rma); null: open.",
            null=True,
        ),
        "nodeState": _field("string", "The Node's gpufleet.io/state when last written."),
        "goodput": {
            **_field(
                "object",
                "What the incident cost the trainings, written by `gpufleet goodput "
                "--write-status` once it closed (docs/goodput.md); absent: not charged.",
            ),
            "properties": {
                "lostGpuSeconds": {
                    **_field("object", "GPU-seconds lost, per ledger category."),
                    "additionalProperties": {"type": "number"},
                },
                "trainings": {
                    **_field("array", "The trainings it cost something."),
                    "items": {"type": "string"},
                },
            },
        },
        "conditions": CONDITIONS,
    },
}
"""Written by the controller (``gpufleet.lifecycle.remediations.status``); null = not yet."""


def spec_schema() -> Json:
    return structural(NodeRemediationSpec.model_json_schema())


def crd_manifest() -> Json:
    return crd(
        NAMES,
        spec=spec_schema(),
        status=STATUS_SCHEMA,
        description="One incident on one node: the ladder, each step tried, the outcome.",
        columns=[
            column("Node", "string", ".spec.node"),
            column("Fault", "string", ".spec.fault"),
            column("Phase", "string", ".status.phase"),
            column("Step", "string", ".status.currentStep"),
            column("Outcome", "string", ".status.outcome"),
            AGE,
        ],
    )
