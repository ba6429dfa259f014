"""Every command has --help text with an example (the CLI's convention, docs/cli.md)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app, command_tree

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


COMMANDS = [path for path, _ in _commands(command_tree(), [])]


def test_every_command_is_found() -> None:
    assert ["nodes"] in COMMANDS and ["node", "return"] in COMMANDS and ["version"] in COMMANDS
    assert len(COMMANDS) > 30


def test_a_command_loads_only_its_own_module() -> None:
    """``gpufleet controller`` in a pod must not import the demo, the local cluster or
    the health checks (seconds of start-up on an emulated core)."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from gpufleet.cli.main import app\n"
        "r = CliRunner().invoke(app, ['controller', '--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('gpufleet.'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(done.stdout.split())
    assert "gpufleet.cli.controller_cmd" in loaded
    for heavy in ("gpufleet.demo.runner", "gpufleet.local.cluster", "gpufleet.health.checks"):
        assert heavy not in loaded, f"gpufleet controller imports {heavy}"


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(path: list[str]) -> None:
    r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "Example" in r.stdout, f"gpufleet {' '.join(path)} --help has no example"
