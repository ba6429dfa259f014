"""``gpufleet policy explain``, ``table`` and ``validate`` as data (-o json, -o yaml)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli.main import app

runner = CliRunner()


def _parse(fmt: str, text: str) -> Any:
    return json.loads(text) if fmt == "json" else yaml.safe_load(text)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_policy_explain_structured_and_the_json_flag(fmt: str) -> None:
    r = runner.invoke(app, ["policy", "explain", "--xid", "79", "-o", fmt])
    assert r.exit_code == 0, r.output
    doc = _parse(fmt, r.stdout)
    assert doc["key"] == "xid-79" and doc["first"] == "reboot"
    old = runner.invoke(app, ["policy", "explain", "--xid", "79", "--json"])
    assert json.loads(old.stdout) == doc


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_policy_table_structured(fmt: str) -> None:
    r = runner.invoke(app, ["policy", "table", "-o", fmt])
    assert r.exit_code == 0, r.output
    rows = {row["fault"]: row for row in _parse(fmt, r.stdout)["faults"]}
    assert rows["xid-79"]["first"] == "reboot" and rows["xid-79"]["condition"] == "GpuProblem"
    assert "straggler" in rows


def test_policy_validate_structured(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [not, a, policy\n")
    r = runner.invoke(app, ["policy", "validate", str(bad), "-o", "json"])
    assert r.exit_code == 1
    (only,) = json.loads(r.stdout)["files"]
    assert only["file"] == str(bad) and only["valid"] is False and only["problems"]
