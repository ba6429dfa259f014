"""``gpufleet sim``: output, runs with a confidence interval, plots, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.sim.model import default_model_text

runner = CliRunner()


def test_json_has_the_ettr_and_a_breakdown_that_adds_up() -> None:
    res = runner.invoke(app, ["sim", "--gpus", "3504", "--days", "30", "--seed", "1", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert 0.9 < data["ettr"] < 1.0
    assert sum(data["breakdown"].values()) == pytest.approx(1.0)
    assert data["breakdown"]["useful"] == data["ettr"]
    assert data["interruptions_total"] > 10
    assert "gpu-faulty" in data["handled"]
    assert 0.95 < data["availability"] <= 1.0
    timeline = data["timeline"]
    assert len(timeline["t_days"]) == len(timeline["production"]) >= 100
    assert timeline["t_days"][-1] <= 30.0


def test_runs_give_a_mean_and_a_confidence_interval(tmp_path: Path) -> None:
    png = tmp_path / "report.png"
    args = ["sim", "--gpus", "512", "--days", "5", "--runs", "3", "--json", "--plot", str(png)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    ettr = data["summary"]["ettr"]
    assert data["summary"]["seeds"] == [0, 1, 2]
    assert ettr["low"] <= ettr["mean"] <= ettr["high"]
    assert len(data["runs"]) == 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_text_output_names_the_ettr() -> None:
    res = runner.invoke(app, ["sim", "--gpus", "256", "--days", "2"])
    assert res.exit_code == 0, res.output
    assert "ETTR" in res.stdout
    assert "where the time went" in res.stdout


def test_a_bad_model_file_is_refused_with_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "model.yaml"
    bad.write_text(default_model_text().replace("restartSeconds: 300", "restartSeconds: -5"))
    res = runner.invoke(app, ["sim", "--model", str(bad), "--days", "1"])
    assert res.exit_code == 2
    assert "job.restartSeconds" in res.output
    assert str(bad) in res.output


def test_a_bad_policy_file_is_refused_with_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(DEFAULT_POLICY_YAML.replace("threshold: 2.5", "threshold: 0"))
    res = runner.invoke(app, ["sim", "--policy", str(bad), "--days", "1"])
    assert res.exit_code == 2
    assert "lemon.threshold" in res.output


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    res = runner.invoke(app, ["sim", "--model", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2
    assert "cannot read" in res.output
