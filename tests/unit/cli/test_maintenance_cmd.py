"""``gpufleet maintenance``: a plan's progress bar and node table, and input refused early."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from typer.testing import CliRunner

from gpufleet.cli import maintenance_cmd
from gpufleet.cli.main import app

runner = CliRunner()


def _plan() -> dict[str, Any]:
    return {
        "metadata": {"name": "driver-550"},
        "spec": {"nodeSelector": {"pool": "h100"}, "action": "reimage", "image": "550.90"},
        "status": {
            "phase": "Progressing",
            "message": "batch in progress: 1 node(s) not verified yet",
            "total": 4,
            "succeeded": 2,
            "failed": 1,
            "inProgress": 1,
            "pending": 0,
            "progress": "3/4",
            "nodes": [
                {"name": "n0", "phase": "Succeeded", "domain": "r1", "imageVersion": "550.90"},
                {"name": "n1", "phase": "Failed", "domain": "r1", "message": "verification failed"},
                {"name": "n2", "phase": "Succeeded", "domain": "r2", "imageVersion": "550.90"},
                {"name": "n3", "phase": "Draining", "domain": "r2", "message": "waiting for Slurm"},
            ],
        },
    }


def _render(wide: bool) -> str:
    out = io.StringIO()
    Console(file=out, width=160, force_terminal=False).print(
        maintenance_cmd._draw_plan(maintenance_cmd._summary(_plan()), wide)
    )
    return out.getvalue()


def test_show_draws_the_counts_the_reason_and_every_node() -> None:
    text = _render(wide=True)
    assert "3/4 finished: 2 succeeded, 1 failed, 1 in progress, 0 pending" in text
    assert "batch in progress" in text
    assert "reimage to 550.90" in text and "pool=h100" in text
    for node, phase in (("n0", "Succeeded"), ("n1", "Failed"), ("n3", "Draining")):
        assert any(node in line and phase in line for line in text.splitlines()), text
    assert "550.90" in text.split("NODE", 1)[1]  # the recorded version, per node (wide)


def test_list_row_says_a_pause_was_asked_while_the_plan_still_runs() -> None:
    s = maintenance_cmd._summary(_plan())
    s["paused"] = True
    assert maintenance_cmd._row(s)[3] == "Progressing (pause asked)"
    assert maintenance_cmd._row(s)[4:6] == ["3/4", "1"]


def test_create_refuses_a_reimage_without_an_image_before_any_request() -> None:
    result = runner.invoke(app, ["maintenance", "create", "x", "--action", "reimage"])
    assert result.exit_code == 2
    assert "a reimage needs spec.image" in result.output


def test_create_refuses_a_selector_that_is_not_key_value() -> None:
    result = runner.invoke(app, ["maintenance", "create", "x", "--action", "noop", "-l", "pool"])
    assert result.exit_code == 2
    assert "--selector wants KEY=VALUE" in result.output


def test_create_refuses_a_start_time_without_a_zone() -> None:
    args = ["maintenance", "create", "x", "--action", "noop", "--start-at", "2026-01-31T02:00"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "startAt needs a time zone" in result.output
