"""The custom resources of the lifecycle controller, generated from the models.

``FleetPolicy.spec`` *is* :class:`gpufleet.domain.policy.Policy`: its OpenAPI
v3 schema is generated from the pydantic model, turned into a Kubernetes
structural schema (references inlined, ``X | None`` as ``nullable``, draft
2020 ``exclusiveMinimum`` as the OpenAPI 3.0 boolean form, ``X | None`` as an
optional ``X``, no
``additionalProperties: false``), so the apiserver rejects wrong types,
negative windows and unknown enum values with a message naming the field.
Cross-field rules (ladder cycles, rule coverage, unknown XIDs) need the whole
policy; the controller checks those and reports them in the FleetPolicy's
status.

``NodeRemediation`` (one per incident) is what a person reads with ``kubectl
get nodremediations``: the fault, the planned ladder, each step tried with its
times and outcome.

``deploy/crds/*.yaml`` are committed copies of :func:`manifests`; a unit test
keeps them equal (regenerate with ``python -m gpufleet.kube.crds deploy/crds``).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from gpufleet.domain import well_known
from gpufleet.domain.policy import Policy

GROUP = well_known.GROUP
VERSION = well_known.VERSION
FLEET_POLICY_PLURAL = "fleetpolicies"
NODE_REMEDIATION_PLURAL = "noderemediations"

Json = dict[str, Any]

_DROP = ("title", "default", "$defs")


def structural(schema: Json) -> Json:
    """A pydantic JSON schema as a Kubernetes structural OpenAPI v3 schema."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[1]])
            extra = {k: v for k, v in node.items() if k != "$ref"}
            return walk({**target, **extra})
        variants = node.get("anyOf")
        if variants is not None:
            rest = [v for v in variants if v.get("type") != "null"]
            if len(rest) == 1:
                # ``X | None`` is an optional field: omit it (the apiserver prunes a
                # null); "nullable" would not help, enums reject null regardless.
                merged = {**rest[0], **{k: v for k, v in node.items() if k != "anyOf"}}
                return walk(merged)
        out: Json = {}
        for key, value in node.items():
            if key in _DROP:
                continue
            if key == "additionalProperties" and value is False:
                continue
            if key == "exclusiveMinimum" and not isinstance(value, bool):
                out["minimum"] = value
                out["exclusiveMinimum"] = True
                continue
            if key == "exclusiveMaximum" and not isinstance(value, bool):
                out["maximum"] = value
                out["exclusiveMaximum"] = True
                continue
            if key == "properties":
                out[key] = {name: walk(sub) for name, sub in value.items()}
                continue
            out[key] = walk(value)
        if "enum" in out and "type" not in out:
            out["type"] = "string"

        if "description" in out:
            out["description"] = " ".join(str(out["description"]).split())
        return out

    result: Json = walk(schema)
    return result


def policy_schema() -> Json:
    """The OpenAPI schema of ``FleetPolicy.spec``."""
    return structural(Policy.model_json_schema(by_alias=True))


_CONDITIONS: Json = {
    "type": "array",
    "description": "Standard conditions (type, status, reason, message, lastTransitionTime).",
    "items": {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer"},
        },
    },
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


def _crd(
    *,
    kind: str,
    plural: str,
    short: list[str],
    spec: Json,
    status: Json,
    columns: list[Json],
    description: str,
) -> Json:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
                "categories": ["gpufleet"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def fleet_policy_crd() -> Json:
    status: Json = {
        "type": "object",
        "properties": {
            "observedGeneration": {"type": "integer"},
            "conditions": _CONDITIONS,
            "breaker": {
                "type": "object",
                "description": "The circuit breaker (kept here across restarts).",
                "properties": {
                    "open": {"type": "boolean"},
                    "trippedAt": {"type": "number", "nullable": True},
                    "lastFaultAt": {"type": "number", "nullable": True},
                    "faultingNodes": {"type": "integer"},
                    "recent": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"node": {"type": "string"}, "at": {"type": "number"}},
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
        },
    }
    spec = policy_schema()
    spec["description"] = "The policy (docs/policy.md); the same fields as a policy file."
    return _crd(
        kind="FleetPolicy",
        plural=FLEET_POLICY_PLURAL,
        short=["fpol"],
        spec=spec,
        status=status,
        description="How gpufleet responds to faults, and the safety rails of automation.",
        columns=[
            {"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused"},
            {"name": "DryRun", "type": "boolean", "jsonPath": ".spec.dryRun"},
            {"name": "Breaker-Open", "type": "boolean", "jsonPath": ".status.breaker.open"},
            {
                "name": "Valid",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Valid")].status',
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
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


def node_remediation_crd() -> Json:
    spec: Json = {
        "type": "object",
        "required": ["node", "fault"],
        "properties": {
            "node": {"type": "string", "description": "The Node being repaired."},
            "fault": {"type": "string", "description": "Fault key (xid-79, ib-port-down, ...)."},
            "description": {"type": "string"},
            "plan": {"type": "string", "description": "The rung the ladder starts at."},
            "ladder": {
                "type": "array",
                "description": "The escalation path from the plan, ending in triage or rma.",
                "items": {"type": "string"},
            },
        },
    }
    status: Json = {
        "type": "object",
        "properties": {
            "phase": {
                "type": "string",
                "enum": ["Draining", "Remediating", "Verifying", "Succeeded", "Escalated"],
            },
            "currentStep": {"type": "string", "nullable": True},
            "steps": {"type": "array", "items": _STEP_STATUS},
            "startedAt": {"type": "string", "format": "date-time"},
            "completedAt": {"type": "string", "format": "date-time", "nullable": True},
            "outcome": {"type": "string", "nullable": True},
            "nodeState": {"type": "string"},
            "conditions": _CONDITIONS,
        },
    }
    return _crd(
        kind="NodeRemediation",
        plural=NODE_REMEDIATION_PLURAL,
        short=["nrem"],
        spec=spec,
        status=status,
        description="One incident on one node: the ladder, each step tried, the outcome.",
        columns=[
            {"name": "Node", "type": "string", "jsonPath": ".spec.node"},
            {"name": "Fault", "type": "string", "jsonPath": ".spec.fault"},
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Step", "type": "string", "jsonPath": ".status.currentStep"},
            {"name": "Outcome", "type": "string", "jsonPath": ".status.outcome"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )


def manifests() -> dict[str, Json]:
    """File name -> CRD manifest, as committed under deploy/crds/."""
    return {
        "fleetpolicies.yaml": fleet_policy_crd(),
        "noderemediations.yaml": node_remediation_crd(),
    }


HEADER = "# Generated by `python -m gpufleet.kube.crds deploy/crds`; do not edit.\n"


def render(manifest: Json) -> str:
    return HEADER + yaml.safe_dump(manifest, sort_keys=False, width=100)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "deploy/crds")
    out.mkdir(parents=True, exist_ok=True)
    for name, manifest in manifests().items():
        (out / name).write_text(render(manifest))
        print(out / name)


if __name__ == "__main__":
    main()
