"""Operator verbs on the command line: required reasons, `node NAME` still shows, identity."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import typer
import yaml
from rich.console import Console
from typer.testing import CliRunner

from gpufleet.cli import operator_cmd
from gpufleet.cli.main import app
from gpufleet.kubeapi import ApiError, NotFound

runner = CliRunner()


def test_every_verb_is_listed_and_documented_with_an_example() -> None:
    out = runner.invoke(app, ["node", "--help"])
    assert out.exit_code == 0
    for verb in ("show", "return", "triage", "rma", "maintenance", "dismiss"):
        assert verb in out.output
        if verb != "show":
            sub = runner.invoke(app, ["node", verb, "--help"])
            assert sub.exit_code == 0 and "Example" in sub.output and "--reason" in sub.output
    reset = runner.invoke(app, ["breaker", "reset", "--help"])
    assert reset.exit_code == 0 and "Example" in reset.output


def test_a_verb_without_a_reason_is_refused_before_anything_is_written() -> None:
    out = runner.invoke(app, ["node", "triage", "n1", "--kubeconfig", "/nonexistent"])
    assert out.exit_code == 2 and "--reason" in out.output
    out = runner.invoke(app, ["node", "return", "n1", "--reason", "  ", "--kubeconfig", "/x"])
    assert out.exit_code == 2 and "must not be empty" in out.output
    out = runner.invoke(app, ["breaker", "reset", "--kubeconfig", "/nonexistent"])
    assert out.exit_code == 2 and "--reason" in out.output


def test_node_name_alone_still_shows_the_node() -> None:
    out = runner.invoke(app, ["node", "gpu-node-0003", "--help"])
    assert out.exit_code == 0 and "history and evidence" in out.output


def test_kubeconfig_user_is_the_fallback_identity(tmp_path: Path) -> None:
    cfg = {
        "current-context": "ops",
        "contexts": [
            {"name": "dev", "context": {"user": "someone-else"}},
            {"name": "ops", "context": {"user": "alice@example.com"}},
        ],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    assert operator_cmd.kubeconfig_user(path) == "alice@example.com"
    assert operator_cmd.kubeconfig_user(tmp_path / "missing") is None


def _exit_code_of(raised: BaseException | None, event: dict | None = None) -> int:
    """The exit code `_carry_out` gives when the request raises ``raised`` or answers ``event``."""

    async def send() -> dict | None:
        if raised is not None:
            raise raised
        return event

    console = Console(file=io.StringIO())
    with pytest.raises(typer.Exit) as exc:
        operator_cmd._carry_out(console, send(), missing="gone", unanswered="late")
        raise typer.Exit(0)
    return exc.value.exit_code


def test_exit_codes_say_what_happened_to_the_request() -> None:
    assert _exit_code_of(NotFound("get nodes n1", 404, "not found")) == 2
    assert _exit_code_of(operator_cmd.NoAnswer()) == 3
    assert _exit_code_of(ApiError("patch nodes n1", 500, "boom")) == 2
    assert _exit_code_of(None, {"type": "Warning", "message": "refused: illegal"}) == 1
    assert _exit_code_of(None, {"type": "Normal", "message": "accepted"}) == 0
