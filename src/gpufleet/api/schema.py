"""A pydantic model's JSON schema as a Kubernetes structural schema, and the CRD around it.

The apiserver accepts only structural OpenAPI v3 schemas: no ``$ref``, no
``anyOf`` for optional fields, no ``additionalProperties: false`` beside
``properties``, the OpenAPI 3.0 boolean ``exclusiveMinimum``. :func:`structural`
turns pydantic's draft 2020 output into that, with one rule for ``X | None``
(docs/decisions/0081):

- default ``None``: an optional ``X``. A ``null`` sent by a client is pruned by
  the apiserver (a field that is neither ``nullable`` nor defaulted), which
  reads the same as an absent field: the model's ``None``.
- any other default: ``X`` with ``nullable: true``, because there ``null``
  means something an absent field does not (``kubernetesPriorityThreshold:
  null`` disables preemption; absent is the default threshold).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from gpufleet.api.names import GROUP, VERSION, Names

Json = dict[str, Any]


def structural(schema: Json, *, defaults: bool = False) -> Json:
    """``schema`` (pydantic's, by alias) as a structural schema.

    ``defaults``: keep the model's defaults so the apiserver fills them in
    (``kubectl get -o yaml`` then shows the effective spec); without it the
    reader's model applies them.
    """
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
            if len(rest) == 1 and len(rest) < len(variants):
                merged = {**rest[0], **{k: v for k, v in node.items() if k != "anyOf"}}
                if merged.get("default") is not None:
                    merged["nullable"] = True
                return walk(merged)
        out: Json = {}
        for key, value in node.items():
            if key in ("title", "$defs"):
                continue
            if key == "default" and (not defaults or value is None):
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
            if key == "default":
                out[key] = copy.deepcopy(value)  # a value, not a schema: kept as is
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


CONDITIONS: Json = {
    "type": "array",
    "description": "Standard conditions (type, status, reason, message, lastTransitionTime).",
    "items": {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "description": "The condition's type, e.g. Ready."},
            "status": {
                "type": "string",
                "enum": ["True", "False", "Unknown"],
                "description": "Whether the condition holds: True, False or Unknown.",
            },
            "reason": {
                "type": "string",
                "description": "Why, as one CamelCase word a program can match on.",
            },
            "message": {"type": "string", "description": "Why, in words for people."},
            "lastTransitionTime": {
                "type": "string",
                "format": "date-time",
                "description": "When status last changed (RFC 3339).",
            },
            "observedGeneration": {
                "type": "integer",
                "description": "The metadata.generation of the spec this condition was set for.",
            },
        },
    },
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}
"""Standard conditions (metav1.Condition), keyed by type."""


def column(name: str, type_: str, path: str) -> Json:
    """One ``kubectl get`` printer column."""
    return {"name": name, "type": type_, "jsonPath": path}


AGE = column("Age", "date", ".metadata.creationTimestamp")


def crd(
    names: Names,
    *,
    spec: Json,
    status: Json,
    columns: Sequence[Json],
    description: str,
    spec_required: bool = False,
) -> Json:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) of one kind, one version."""
    kind_names: Json = {
        "kind": names.kind,
        "listKind": names.list_kind,
        "plural": names.plural,
        "singular": names.singular,
        "shortNames": list(names.short_names),
    }
    if names.categories:
        kind_names["categories"] = list(names.categories)
    root: Json = {"type": "object", "description": description}
    if spec_required:
        root["required"] = ["spec"]
    root["properties"] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": spec,
        "status": status,
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": names.crd_name},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if names.namespaced else "Cluster",
            "names": kind_names,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": list(columns),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }
