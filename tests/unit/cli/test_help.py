"""Every command has --help text with an example (the CLI's convention, docs/cli.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from gpufleet.cli.main import app

runner = CliRunner()


def _commands(cmd: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
    subs = getattr(cmd, "commands", None)
    if not subs:
        yield path, cmd
        return
    if getattr(cmd, "invoke_without_command", False):  # a group that also runs: its help too
        yield path, cmd
    for name, sub in subs.items():
        yield from _commands(sub, [*path, name])


COMMANDS = [path for path, _ in _commands(get_command(app), [])]


def test_every_command_is_found() -> None:
    assert ["nodes"] in COMMANDS and ["node", "return"] in COMMANDS and ["version"] in COMMANDS
    assert len(COMMANDS) > 30


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(path: list[str]) -> None:
    r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "Example" in r.stdout, f"gpufleet {' '.join(path)} --help has no example"
