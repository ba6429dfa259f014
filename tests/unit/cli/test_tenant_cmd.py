"""``gpufleet tenant check``: Tenant YAML validated offline, every problem with its field."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpufleet.cli.main import app

runner = CliRunner()

VALID = """\
apiVersion: gpufleet.io/v1alpha1
kind: Tenant
metadata: {name: vision}
spec:
  namespaces: [vision, vision-serve]
  users: [{name: alice, uid: 20001, gid: 20001, sshKeys: ["ssh-ed25519 AAAA alice"]}]
  slurm: {qos: [normal], defaultQos: normal}
  gpuQuota: 16
"""


def test_a_valid_file_passes(tmp_path: Path) -> None:
    f = tmp_path / "vision.yaml"
    f.write_text(VALID)
    result = runner.invoke(app, ["tenant", "check", str(f)])
    assert result.exit_code == 0, result.output
    assert "1 tenant(s) valid" in result.output


def test_problems_and_conflicts_are_named(tmp_path: Path) -> None:
    f = tmp_path / "two.yaml"
    f.write_text(
        VALID
        + """---
apiVersion: gpufleet.io/v1alpha1
kind: Tenant
metadata: {name: nlp}
spec:
  namespaces: [vision]
  users: [{name: bob, uid: 20001, gid: 20002}]
---
apiVersion: gpufleet.io/v1alpha1
kind: Tenant
metadata: {name: bad}
spec:
  gpuQuota: -2
  users: [{name: carol, uid: 10, gid: 20003}]
  colour: blue
"""
    )
    result = runner.invoke(app, ["tenant", "check", str(f)])
    assert result.exit_code == 1
    out = result.output
    assert f"{f}: bad: spec.gpuQuota: Input should be greater than or equal to 0" in out
    assert f"{f}: bad: spec.users.0.uid: Input should be greater than or equal to 1000" in out
    assert f"{f}: bad: spec.colour: Extra inputs are not permitted" in out
    assert "tenant nlp: conflict: namespace vision belongs to tenant vision" in out
    assert "tenant nlp: conflict: uid 20001 is user alice of tenant vision" in out


def test_an_unreadable_file_is_exit_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["tenant", "check", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2
