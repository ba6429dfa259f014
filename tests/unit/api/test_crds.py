"""Every committed CRD YAML is the generator's output, and the schemas keep their validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.api import crds, fleetpolicy, machine, noderemediation, slurmcluster

ROOT = Path(__file__).resolve().parents[3]
REGENERATE = "run python -m gpufleet.api.crds"


@pytest.mark.parametrize("directory", crds.DIRS)
def test_committed_crds_are_the_generated_ones(directory: str) -> None:
    generated = crds.manifests()
    committed = {p.name for p in (ROOT / directory).glob("*.yaml")}
    assert committed == set(generated), f"{directory}: CRD files differ from the API; {REGENERATE}"
    for name, manifest in generated.items():
        text = (ROOT / directory / name).read_text()
        assert text == crds.render(manifest), f"{directory}/{name} is stale: {REGENERATE}"


def test_one_file_per_kind() -> None:
    kinds = {m["spec"]["names"]["kind"] for m in crds.manifests().values()}
    assert kinds == {"FleetPolicy", "NodeRemediation", "Machine", "SlurmCluster"}


def _spec(manifest: dict[str, Any]) -> dict[str, Any]:
    version = manifest["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


@pytest.mark.parametrize("name", sorted(crds.manifests()))
def test_schemas_are_structural(name: str) -> None:
    manifest = crds.manifests()[name]
    text = json.dumps(manifest)
    for forbidden in ('"$ref"', '"anyOf"', '"oneOf"', '"allOf"', '"$defs"', '"title"'):
        assert forbidden not in text
    assert '"additionalProperties": false' not in text
    version = manifest["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert version["additionalPrinterColumns"][-1]["name"] == "Age"


def test_policy_schema_keeps_ranges_and_enums() -> None:
    spec = fleetpolicy.spec_schema()["properties"]
    window = spec["safety"]["properties"]["breaker"]["properties"]["windowSeconds"]
    assert window == {"type": "number", "minimum": 0, "exclusiveMinimum": True}
    mode = spec["drain"]["properties"]["mode"]
    assert mode["type"] == "string" and "evict" in mode["enum"]
    rule = spec["rules"]["items"]["properties"]
    assert "nullable" not in rule["drain"] and "null" not in str(rule["drain"]["enum"])
    xid = rule["match"]["properties"]["xid"]
    assert xid == {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 65535}


def test_nullable_only_where_null_differs_from_absent() -> None:
    """``X | None = None``: optional (a null is pruned = absent); other defaults: nullable."""
    spec = _spec(slurmcluster.crd_manifest())["properties"]
    threshold = spec["preemption"]["properties"]["kubernetesPriorityThreshold"]
    assert threshold == {
        "type": "integer",
        "nullable": True,
        "default": 1_000_000,
        "description": threshold["description"],
    }
    gpu_type = spec["nodePools"]["items"]["properties"]["gpuType"]
    assert "nullable" not in gpu_type and "default" not in gpu_type
    digest = _spec(machine.crd_manifest())["properties"]["enrollmentDigest"]
    assert "nullable" not in digest and digest["type"] == "string"


def test_slurmcluster_schema_holds_the_injection_patterns() -> None:
    spec = _spec(slurmcluster.crd_manifest())
    assert spec["required"] == ["nodePools", "partitions"]
    pool = spec["properties"]["nodePools"]["items"]["properties"]
    assert pool["gpuType"]["pattern"] == slurmcluster.WORD
    assert pool["gpuFiles"]["pattern"] == slurmcluster.VALUE
    assert pool["features"]["items"]["pattern"] == slurmcluster.WORD
    assert pool["featureLabels"]["items"]["pattern"] == slurmcluster.LABEL_KEY
    assert spec["properties"]["controllerHost"]["pattern"] == slurmcluster.HOST
    assert spec["properties"]["extraConfig"]["items"]["pattern"] == slurmcluster.LINE
    assert pool["cpus"]["default"] == 64  # the apiserver fills SlurmCluster defaults


def test_machine_schema_is_the_models_and_as_strict_as_the_stored_form() -> None:
    spec = _spec(machine.crd_manifest())
    assert spec["required"] == ["macs", "serial", "bmc", "hardware"]
    props = spec["properties"]
    assert props["macs"]["minItems"] == 1
    assert props["macs"]["items"]["pattern"] == r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$"
    assert props["bmc"]["required"] == ["endpoint", "credentialsSecret"]
    assert props["bmc"]["properties"]["endpoint"]["pattern"] == r"^https?://"
    assert props["pool"]["maxLength"] == 63 and "default" not in props["pool"]
    hardware = props["hardware"]["properties"]
    assert hardware["gpuCount"] == {"type": "integer", "minimum": 0, "maximum": 64}
    assert props["enrollmentDigest"]["pattern"] == r"^sha256:[0-9a-f]{64}$"
    # the fields are the model's, by alias
    assert set(props) == {f.alias or n for n, f in machine.MachineSpec.model_fields.items()}


def test_noderemediation_spec_is_the_models() -> None:
    spec = _spec(noderemediation.crd_manifest())
    assert spec["required"] == ["node", "fault"]
    assert set(spec["properties"]) == set(noderemediation.NodeRemediationSpec.model_fields)
    status = noderemediation.crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    phase = status["properties"]["status"]["properties"]["phase"]
    assert phase["enum"] == list(noderemediation.PHASES)
