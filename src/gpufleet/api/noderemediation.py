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
    description: str = ""
    plan: str = Field(default="", description="The rung the ladder starts at.")
    ladder: list[str] = Field(
        default_factory=list,
        description="The escalation path from the plan, ending in triage or rma.",
    )


_STEP_STATUS: Json = {
    "type": "object",
    "properties": {
        "step": {"type": "string"},
        "attempt": {"type": "integer"},
        "startedAt": {"type": "string", "format": "date-time"},
        "endedAt": {"type": "string", "format": "date-time", "nullable": True},
        "outcome": {"type": "string", "nullable": True},
        "detail": {"type": "string"},
    },
}

STATUS_SCHEMA: Json = {
    "type": "object",
    "properties": {
        "phase": {"type": "string", "enum": list(PHASES)},
        "currentStep": {"type": "string", "nullable": True},
        "steps": {"type": "array", "items": _STEP_STATUS},
        "startedAt": {"type": "string", "format": "date-time"},
        "completedAt": {"type": "string", "format": "date-time", "nullable": True},
        "outcome": {"type": "string", "nullable": True},
        "nodeState": {"type": "string"},
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
