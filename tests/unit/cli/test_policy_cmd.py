from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML

runner = CliRunner()


def test_explain_xid79_is_reboot_class() -> None:
    r = runner.invoke(app, ["policy", "explain", "--xid", "79"])
    assert r.exit_code == 0, r.output
    assert "RESTART_BM" in r.output
    assert "one occurrence: reboot" in r.output
    assert "1. reboot" in r.output and "power-cycle" in r.output


def test_explain_xid13_one_occurrence_keeps_the_node() -> None:
    r = runner.invoke(app, ["policy", "explain", "--xid", "13", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["first"] == "restart-job"
    assert data["takes_node_out"] is False
    assert data["repeat_takes_node_out"] is True
    assert data["repeat"].startswith("3 occurrences on the same GPU")


def test_explain_fault_and_bad_names() -> None:
    r = runner.invoke(app, ["policy", "explain", "--fault", "ib-link-flap"])
    assert r.exit_code == 0 and "InfinibandProblem" in r.output
    r = runner.invoke(app, ["policy", "explain", "--fault", "gremlins"])
    assert r.exit_code == 2 and "unknown fault 'gremlins'" in r.output
    r = runner.invoke(app, ["policy", "explain"])
    assert r.exit_code == 2


def test_explain_with_a_custom_policy(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(
        DEFAULT_POLICY_YAML.replace(
            "  - match: {xid: 79}\n    action: reboot",
            "  - match: {xid: 79}\n    action: power-cycle",
        )
    )
    r = runner.invoke(app, ["policy", "explain", "--xid", "79", "--policy", str(p)])
    assert r.exit_code == 0, r.output
    assert "one occurrence: power-cycle" in r.output


def test_validate_warns_of_an_xid_missing_from_the_catalogue(tmp_path: Path) -> None:
    newer = tmp_path / "newer.yaml"
    newer.write_text(DEFAULT_POLICY_YAML.replace("  - match: {xid: 92}", "  - match: {xid: 999}"))
    r = runner.invoke(app, ["policy", "validate", str(newer)])
    assert r.exit_code == 0, r.output
    assert "valid" in r.output and "warning" in r.output and "XID 999" in r.output


def test_explain_refuses_xid_zero(tmp_path: Path) -> None:
    r = runner.invoke(app, ["policy", "explain", "--xid", "0"])
    assert r.exit_code == 2


def test_validate_reports_every_problem_and_fails(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(DEFAULT_POLICY_YAML)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        DEFAULT_POLICY_YAML.replace("threshold: 2.5", "threshold: -1").replace(
            "  - match: {xid: 92}", "  - match: {xid: 0}"
        )
    )
    r = runner.invoke(app, ["policy", "validate", str(good)])
    assert r.exit_code == 0 and "valid" in r.output
    r = runner.invoke(app, ["policy", "validate", str(good), str(bad)])
    assert r.exit_code == 1
    assert "2 problem(s)" in r.output
    assert "match.xid" in r.output and "lemon.threshold" in r.output
    assert "line " in r.output
    r = runner.invoke(app, ["policy", "validate", str(tmp_path / "missing.yaml")])
    assert r.exit_code == 1 and "cannot read" in r.output


def test_show_prints_a_valid_policy_and_table_lists_all() -> None:
    r = runner.invoke(app, ["policy", "show"])
    assert r.exit_code == 0 and r.output == DEFAULT_POLICY_YAML
    r = runner.invoke(app, ["policy", "table"])
    assert r.exit_code == 0
    assert "xid-79" in r.output and "straggler" in r.output
