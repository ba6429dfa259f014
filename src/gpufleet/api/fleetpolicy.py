"""``FleetPolicy``: the cluster's policy, whose spec *is* :class:`gpufleet.domain.policy.Policy`.

The spec schema is generated from the policy model, so the apiserver rejects
wrong types, negative windows and unknown enum values with a message naming
the field. Cross-field rules (ladder cycles, rule coverage, unknown XIDs) need
the whole policy; the controller checks those and reports them in the status.
"""

from __future__ import annotations

from gpufleet.api.names import FLEET_POLICY
from gpufleet.api.schema import AGE, CONDITIONS, Json, column, crd, structural
from gpufleet.domain import policy_compat
from gpufleet.domain.policy import Policy

NAMES = FLEET_POLICY
PLURAL = NAMES.plural
_FIELD = {"paused": "paused", "dryRun": "dry_run"}
"""Spec key (alias) -> Policy field."""


def spec_schema() -> Json:
    """The OpenAPI schema of ``FleetPolicy.spec``, with the fields an earlier version had:
    the apiserver keeps accepting a policy written for it (domain.policy_compat)."""
    schema = structural(Policy.model_json_schema(by_alias=True))
    for field in policy_compat.REMOVED:
        _accept_removed(schema, field)
    return schema


def _accept_removed(schema: Json, field: policy_compat.RemovedField) -> None:
    node = schema
    for part in field.path[:-1]:
        node = node["properties"][part]
    node["properties"][field.path[-1]] = {
        **field.schema,
        "description": f"Deprecated: removed in {field.removed_in} ({field.decision}); use "
        f"{field.replaced_by}. Still accepted"
        + (f" and read as {field.replaced_by}: {field.how}" if field.convert else ", ignored")
        + "; the controller warns (Event and condition Deprecated on the FleetPolicy).",
    }


STATUS_SCHEMA: Json = {
    "type": "object",
    "description": "Written by the lifecycle controller: whether the policy is valid, the "
    "breaker's state, the recent actions and the budgets in use.",
    "properties": {
        "observedGeneration": {
            "type": "integer",
            "description": "The metadata.generation of the spec the controller last read.",
        },
        "conditions": CONDITIONS,
        "breaker": {
            "type": "object",
            "description": "The circuit breaker (kept here across restarts).",
            "properties": {
                "open": {
                    "type": "boolean",
                    "description": "True: automatic disruption is stopped (gpufleet breaker "
                    "reset closes it; it closes by itself after safety.breaker.cooldownSeconds).",
                },
                "trippedAt": {
                    "type": "number",
                    "nullable": True,
                    "description": "When it last opened (epoch seconds); null: closed.",
                },
                "lastFaultAt": {
                    "type": "number",
                    "nullable": True,
                    "description": "When the last faulting node was counted (epoch seconds).",
                },
                "faultingNodes": {
                    "type": "integer",
                    "description": "Distinct nodes counted within safety.breaker.windowSeconds.",
                },
                "recent": {
                    "type": "array",
                    "description": "The faults counted in the window: which node, when.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "node": {"type": "string", "description": "The Node's name."},
                            "at": {
                                "type": "number",
                                "description": "When it faulted (epoch seconds).",
                            },
                        },
                    },
                },
            },
        },
        "recentActions": {
            "type": "array",
            "description": "Times (epoch seconds) of recent disruptive actions (rate limit).",
            "items": {"type": "number"},
        },
        "budget": {
            "type": "object",
            "description": "Per pool: size, out of service, allowed.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "groupBudget": {
            "type": "object",
            "description": "Per node group with a budget of its own (spec.overrides[].budget, "
            "counted on the group's nodes in every pool): size, out of service, allowed, waiting.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "domainBudget": {
            "type": "object",
            "description": "Per NVLink domain at its budget (safety.budget.perDomain; domains "
            "below it are not listed): size, out of service, allowed, waiting.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "domainFaults": {
            "type": "object",
            "description": "Per NVLink domain judged faulty or held (domainFaults; docs/"
            "decisions/0240): size, faulty, the trays reporting a fabric fault, trays held, "
            "trays waiting to be taken out, and why.",
            "x-kubernetes-preserve-unknown-fields": True,
        },
        "fleetBudget": {
            "type": "object",
            "description": "The whole fleet (every pool): size, out of service, allowed "
            "(absent: the policy sets no fleet-wide limit), waiting.",
            "properties": {
                "size": {"type": "integer", "description": "Nodes in the fleet."},
                "outOfService": {
                    "type": "integer",
                    "description": "Nodes that automation holds out of service now.",
                },
                "allowed": {
                    "type": "integer",
                    "nullable": True,
                    "description": "Nodes that may be out at once (safety.budget.fleetMaxNodes, "
                    "fleetMaxPercent); null: no fleet-wide limit.",
                },
                "waiting": {
                    "type": "integer",
                    "description": "Nodes holding a fault a safety rail withheld (kept, retried), "
                    "every pool together.",
                },
            },
        },
    },
}
"""Written by the controller only (no model: the breaker's state is kept as it writes it)."""


def crd_manifest() -> Json:
    spec = spec_schema()
    spec["description"] = "The policy (docs/policy.md); the same fields as a policy file."
    # Defaulted by the apiserver so the PAUSED and DRYRUN columns are never blank (the
    # model's defaults are the same; the other fields keep the reader's defaults).
    for switch in ("paused", "dryRun"):
        spec["properties"][switch]["default"] = Policy.model_fields[_FIELD[switch]].default
    return crd(
        NAMES,
        spec=spec,
        status=STATUS_SCHEMA,
        description="How gpufleet responds to faults, and the safety rails of automation.",
        columns=[
            column("Paused", "boolean", ".spec.paused"),
            column("DryRun", "boolean", ".spec.dryRun"),
            column("Breaker-Open", "boolean", ".status.breaker.open"),
            column("Valid", "string", '.status.conditions[?(@.type=="Valid")].status'),
            AGE,
        ],
    )
