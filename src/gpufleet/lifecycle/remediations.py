"""``NodeRemediation`` objects: one per incident, projected from the node's record.

The record on the Node is what the controller decides from (and resumes
from after a restart); the NodeRemediation shows the same facts to people
(``kubectl get nrem``): the fault, the planned ladder, every step tried with
its times and outcome, and where it ended. Pure: builds the JSON only.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from gpufleet.api import conditions
from gpufleet.domain import well_known
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import LadderStep, Policy
from gpufleet.domain.records import Incident, NodeRecord
from gpufleet.domain.states import NodeState

KIND = "NodeRemediation"
Json = dict[str, Any]

_PHASE = {
    NodeState.DRAINING: "Draining",
    NodeState.REMEDIATING: "Remediating",
    NodeState.VERIFYING: "Verifying",
    NodeState.PRODUCTION: "Succeeded",
    NodeState.TRIAGE: "Escalated",
    NodeState.RMA: "Escalated",
}


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def name_for(node: str, incident: Incident) -> str:
    """Object name: node name and the incident's start (ms), DNS-1123 safe."""
    base = re.sub(r"[^a-z0-9.-]", "-", node.lower())[:200]
    return f"{base}-{int(incident.opened_at * 1000)}"


def ladder_of(policy: Policy, incident: Incident) -> list[str]:
    if incident.plan is None:
        return []
    return [
        e.step.value if isinstance(e, LadderStep) else Step(e).value
        for e in policy.walk(incident.plan)
    ]


def manifest(node: str, incident: Incident, policy: Policy) -> Json:
    return {
        "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
        "kind": KIND,
        "metadata": {
            "name": name_for(node, incident),
            # Marks the object as the controller's: anyone may create a NodeRemediation,
            # and `gpufleet status` must not show a forged one as an active repair.
            "labels": {
                "gpufleet.io/node": node[:63],
                well_known.LABEL_MANAGED_BY: well_known.CONTROLLER,
            },
        },
        "spec": {
            "node": node,
            "fault": incident.key,
            "description": incident.description[:1000],
            "plan": incident.plan.value if incident.plan else "",
            "ladder": ladder_of(policy, incident),
        },
    }


def status(record: NodeRecord, incident: Incident, now: float) -> Json:
    """The status for ``incident``, given the node's record after a decision."""
    phase = _PHASE.get(record.state, "Escalated")
    finished = record.state in (NodeState.PRODUCTION, NodeState.TRIAGE, NodeState.RMA)
    outcome = None
    if record.state is NodeState.PRODUCTION:
        outcome = "repaired"
    elif record.state in (NodeState.TRIAGE, NodeState.RMA):
        outcome = record.state.value
    steps = [
        {
            "step": a.step.value,
            "attempt": a.attempt,
            "startedAt": iso(a.started_at),
            "endedAt": iso(a.ended_at),
            "outcome": a.outcome.value if a.outcome else None,
            "detail": a.detail[:500],
        }
        for a in incident.tried
    ]
    cond_status: conditions.Status = (
        "True" if outcome == "repaired" else ("False" if finished else "Unknown")
    )
    return {
        "phase": phase,
        "nodeState": record.state.value,
        "currentStep": incident.current.value if incident.current and not finished else None,
        "steps": steps,
        "startedAt": iso(incident.opened_at),
        "completedAt": iso(now) if finished else None,
        "outcome": outcome,
        # Unknown from the incident's start; True or False from the state that ended it:
        # lastTransitionTime is when the status last changed (api.conditions).
        "conditions": [
            conditions.condition(
                "Succeeded",
                cond_status,
                phase,
                record.reason[:500],
                since=record.since if finished else incident.opened_at,
            )
        ],
    }
