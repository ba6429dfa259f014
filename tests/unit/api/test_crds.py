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


def test_the_crd_chart_templates_are_the_crds_kept_on_uninstall() -> None:
    """The CRD chart upgrades the same CRDs as the plain copies, each marked to be kept:
    uninstalling a CRD would delete every object of its kind (decision 0184)."""
    generated = crds.manifests()
    committed = {p.name for p in (ROOT / crds.CHART_DIR).glob("*.yaml")}
    assert committed == set(generated), f"{crds.CHART_DIR}: CRD files differ; {REGENERATE}"
    for name, manifest in generated.items():
        chart = crds.chart_manifest(manifest)
        text = (ROOT / crds.CHART_DIR / name).read_text()
        assert text == crds.render(chart), f"{crds.CHART_DIR}/{name} is stale: {REGENERATE}"
        assert chart["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
        assert chart["spec"] == manifest["spec"]
        assert "{{" not in text  # a template helm renders as it is
    assert "annotations" not in next(iter(generated.values()))["metadata"]  # not changed


def test_one_file_per_kind() -> None:
    kinds = {m["spec"]["names"]["kind"] for m in crds.manifests().values()}
    assert kinds == {
        "FleetPolicy",
        "NodeRemediation",
        "Machine",
        "SlurmCluster",
        "MaintenancePlan",
        "Tenant",
    }


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


def _checks(schema: dict[str, Any]) -> dict[str, Any]:
    """What the apiserver checks of a field: its schema less the description."""
    return {k: v for k, v in schema.items() if k != "description"}


def test_policy_schema_keeps_ranges_and_enums() -> None:
    spec = fleetpolicy.spec_schema()["properties"]
    window = spec["safety"]["properties"]["breaker"]["properties"]["windowSeconds"]
    assert _checks(window) == {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 30 * 86400,  # every number bounded (domain.bounds): the apiserver too
    }
    budget = spec["safety"]["properties"]["budget"]["properties"]
    assert budget["maxNodes"]["maximum"] == 100_000
    assert _checks(budget["fleetMaxNodes"]) == {"type": "integer", "minimum": 0, "maximum": 100_000}
    mode = spec["drain"]["properties"]["mode"]
    assert mode["type"] == "string" and "evict" in mode["enum"]
    rule = spec["rules"]["items"]["properties"]
    assert "nullable" not in rule["drain"] and "null" not in str(rule["drain"]["enum"])
    xid = rule["match"]["properties"]["xid"]
    assert _checks(xid) == {
        "type": "integer",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 65535,
    }


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
    assert _checks(hardware["gpuCount"]) == {"type": "integer", "minimum": 0, "maximum": 64}
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


def test_every_kind_is_in_the_gpufleet_category() -> None:
    """``kubectl get gpufleet`` lists every gpufleet object."""
    for manifest in crds.manifests().values():
        assert "gpufleet" in manifest["spec"]["names"].get("categories", []), manifest["metadata"]


def _root(manifest: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = manifest["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


@pytest.mark.parametrize("name", sorted(crds.manifests()))
def test_every_printer_column_names_a_field_of_the_schema(name: str) -> None:
    """A column whose path the schema does not have is blank forever."""
    manifest = crds.manifests()[name]
    for col in manifest["spec"]["versions"][0]["additionalPrinterColumns"]:
        path = col["jsonPath"]
        if path.startswith(".metadata."):
            continue
        if ".conditions[" in path:
            head, _, rest = path.partition("[?(@.type==")
            ctype = rest.split('"')[1]
            assert ctype, path
            path = head
        node = _root(manifest)
        for part in path.strip(".").split("."):
            props = node.get("properties") or {}
            if part not in props and isinstance(node.get("additionalProperties"), dict):
                node = node["additionalProperties"]  # a map: any key (the writer's job)
                continue
            assert part in props, f"{name}: column {col['name']} names {col['jsonPath']}"
            node = props[part]


def test_machine_and_fleetpolicy_columns_are_defaulted_by_the_apiserver() -> None:
    """PHASE/ARMED of a Machine nobody has written a status for, and PAUSED/DRYRUN of a
    FleetPolicy that does not set them, read as what they mean instead of blank."""
    status = _root(machine.crd_manifest())["properties"]["status"]
    assert status["default"] == {}
    assert status["properties"]["phase"]["default"] == "Registered"
    assert status["properties"]["armed"]["default"] is True
    spec = _root(fleetpolicy.crd_manifest())["properties"]["spec"]["properties"]
    assert spec["paused"]["default"] is False and spec["dryRun"]["default"] is False


def test_every_status_has_standard_conditions() -> None:
    for manifest in crds.manifests().values():
        status = _root(manifest)["properties"]["status"]["properties"]
        conds = status["conditions"]
        assert conds["x-kubernetes-list-map-keys"] == ["type"], manifest["metadata"]
        assert "observedGeneration" in conds["items"]["properties"]


def test_the_generator_takes_no_option_for_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert crds.main(["--help"]) == 0
    assert "usage: python -m gpufleet.api.crds" in capsys.readouterr().out
    assert crds.main(["-o", "x"]) == 2
    assert list(tmp_path.iterdir()) == []  # no directory named after an option
    assert crds.main([str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(crds.manifests())
    assert not (tmp_path / "deploy").exists()  # a directory given: plain copies there only
