"""The chart's values, schema and docs/install.md describe the same values, with the same defaults.

helm itself refuses a values.yaml key the schema does not know (the schema forbids extra
properties); these checks run without helm: every schema value has a default in values.yaml,
every values.yaml key is typed, and docs/install.md's table lists each one with its default.
`scripts/chart-values` rewrites the table and the schema's SlurmCluster parts from their sources.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpufleet"
ROW = re.compile(r"^\| `(?P<path>[A-Za-z0-9_.]+)` \| `(?P<default>.*)` \| (?P<meaning>.+) \|$")


def _schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def _values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def _is_section(schema: dict[str, Any]) -> bool:
    """A chart-defined object (its keys are values of their own), not a free-form one."""
    return (
        schema.get("type") == "object"
        and "properties" in schema
        and schema.get("additionalProperties") is False
    )


def _leaves(schema: dict[str, Any], values: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    assert isinstance(values, dict), f"{prefix or 'values'}: not a mapping"
    extra = set(values) - set(schema["properties"])
    assert not extra, f"values.yaml keys missing from values.schema.json: {prefix}{sorted(extra)}"
    for key, sub in schema["properties"].items():
        path = f"{prefix}{key}"
        assert key in values, f"{path}: in the schema, no default in values.yaml"
        assert sub.get("description"), f"{path}: the schema gives no description"
        if _is_section(sub):
            yield from _leaves(sub, values[key], f"{path}.")
        else:
            yield path, values[key]


def _documented() -> dict[str, str]:
    text = (ROOT / "docs" / "install.md").read_text()
    rows = [m for line in text.splitlines() if (m := ROW.match(line))]
    paths = [m["path"] for m in rows]
    assert len(paths) == len(set(paths)), "a value is documented twice"
    return {m["path"]: m["default"] for m in rows}


def test_every_value_is_typed_and_has_a_default() -> None:
    leaves = dict(_leaves(_schema(), _values()))
    assert {"agent.backend", "controller.replicas", "slurm.restd.port"} <= set(leaves)


def test_install_doc_lists_every_value_with_its_default() -> None:
    leaves = dict(_leaves(_schema(), _values()))
    documented = _documented()
    assert set(documented) == set(leaves), (
        "run scripts/chart-values; "
        f"missing from docs/install.md: {sorted(set(leaves) - set(documented))}; "
        f"documented but not a value: {sorted(set(documented) - set(leaves))}"
    )
    for path, default in leaves.items():
        assert json.loads(documented[path]) == default, (
            f"{path}: docs/install.md default differs; run scripts/chart-values"
        )


def test_enums_name_the_real_agent_backends() -> None:
    from gpufleet.cli.options import Backend

    backend = _schema()["properties"]["agent"]["properties"]["backend"]
    assert backend["enum"] == [b.value for b in Backend]


def test_slurm_values_are_typed_by_the_slurmcluster_crd() -> None:
    """The values that become the SlurmCluster's spec carry its CRD's own schema (closed to
    unknown keys), so helm refuses what the apiserver would refuse, before anything is applied."""
    crd = yaml.safe_load((CHART / "crds" / "slurmclusters.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    slurm = _schema()["properties"]["slurm"]["properties"]
    for key in ("nodePools", "partitions"):
        ours = slurm[key]["items"]
        assert ours.pop("additionalProperties") is False, key
        assert ours == spec["properties"][key]["items"], f"slurm.{key}: run scripts/chart-values"
    checks = slurm["healthChecks"]
    assert checks["additionalProperties"] is False
    theirs = spec["properties"]["healthChecks"]["properties"]
    assert set(checks["properties"]) == set(theirs)
    for name, prop in checks["properties"].items():
        assert {k: v for k, v in prop.items() if k != "description"} == {
            k: v for k, v in theirs[name].items() if k != "description"
        }, name


def test_schema_and_install_doc_are_what_scripts_chart_values_writes() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chart-values"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
