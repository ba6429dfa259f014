"""The committed CRDs are the generated ones, and the schema is structural."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.kube import crds

ROOT = Path(__file__).resolve().parents[3]


def test_committed_crds_equal_the_generated_ones() -> None:
    for name, manifest in crds.manifests().items():
        committed = (ROOT / "deploy" / "crds" / name).read_text()
        assert committed == crds.render(manifest), (
            f"deploy/crds/{name} is stale: run python -m gpufleet.kube.crds deploy/crds"
        )


def test_policy_schema_is_structural() -> None:
    text = json.dumps(crds.policy_schema())
    for forbidden in ('"$ref"', '"anyOf"', '"oneOf"', '"allOf"', '"$defs"', '"title"'):
        assert forbidden not in text
    assert '"additionalProperties": false' not in text


def test_policy_schema_keeps_ranges_and_enums() -> None:
    spec = crds.policy_schema()["properties"]
    window = spec["safety"]["properties"]["breaker"]["properties"]["windowSeconds"]
    assert window == {"type": "number", "minimum": 0, "exclusiveMinimum": True}
    mode = spec["drain"]["properties"]["mode"]
    assert mode["type"] == "string" and "evict" in mode["enum"]
    rule = spec["rules"]["items"]["properties"]
    assert "nullable" not in rule["drain"] and "null" not in str(rule["drain"]["enum"])
    assert rule["match"]["properties"]["xid"] == {"type": "integer"}
