"""``gpufleet policy`` with a policy file written for an earlier version: it is used, and each
removed field is named on stderr with its replacement (docs/decisions/0189)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML

runner = CliRunner()


def _old_policy(tmp_path: Path) -> Path:
    spec = yaml.safe_load(DEFAULT_POLICY_YAML)
    spec["lemon"] = {"incidents": 3, "windowDays": 7}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"kind": "FleetPolicy", "spec": spec}))
    return path


def test_validate_accepts_it_and_warns_with_the_replacement(tmp_path: Path) -> None:
    path = _old_policy(tmp_path)
    r = runner.invoke(app, ["policy", "validate", str(path)])
    assert r.exit_code == 0, r.output
    assert "valid" in r.stdout
    assert "lemon.incidents was removed in 0.1.0" in r.stderr
    assert "use lemon.halfLifeDays" in r.stderr
    data = json.loads(runner.invoke(app, ["policy", "validate", str(path), "-o", "json"]).stdout)
    (checked,) = data["files"]
    assert checked["valid"] and len(checked["warnings"]) == 2


def test_a_command_that_uses_the_policy_warns_then_goes_on(tmp_path: Path) -> None:
    r = runner.invoke(app, ["policy", "table", "--policy", str(_old_policy(tmp_path))])
    assert r.exit_code == 0, r.output
    assert "XID" in r.stdout or "xid" in r.stdout
    assert "use lemon.threshold" in r.stderr
