"""``gpufleet policy`` on hostile files: one line, an exit code, no traceback, no full read."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML

runner = CliRunner()


def _validate(path: Path | str) -> tuple[int, str]:
    r = runner.invoke(app, ["policy", "validate", str(path)])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r.exit_code, r.output


def _one_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    return lines[0]


def test_ten_megabyte_file_is_refused_without_being_parsed(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    # Starts as a valid policy, then 10 MB of one string: a parser would read it all.
    big.write_bytes(DEFAULT_POLICY_YAML.encode() + b"# " + b"x" * (10 * 1024 * 1024) + b"\n")
    code, out = _validate(big)
    assert code == 1
    assert _one_line(out) == f"{big}: (file): too large: more than 1048576 bytes (1 MiB)"


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_an_endless_file_is_read_only_up_to_the_limit() -> None:
    """/dev/zero never ends: reading it whole would never return."""
    code, out = _validate("/dev/zero")
    assert code == 1 and "too large" in _one_line(out)


def test_non_utf8_file(tmp_path: Path) -> None:
    p = tmp_path / "latin1.yaml"
    p.write_bytes(DEFAULT_POLICY_YAML.encode() + "# caf\u00e9\n".encode("latin-1"))
    code, out = _validate(p)
    assert code == 1
    line = _one_line(out)
    assert line.startswith(f"{p}: line ") and "not UTF-8 text: byte 0xe9" in line


def test_deeply_nested_file(tmp_path: Path) -> None:
    p = tmp_path / "deep.yaml"
    p.write_text("paused: " + "[" * 50_000 + "]" * 50_000 + "\n")
    code, out = _validate(p)
    assert code == 1
    assert _one_line(out) == f"{p}: line 1: (file): too deep: nested more than 32 levels"


def test_alias_bomb(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x,x,x,x,x,x,x,x,x,x]"]
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(lines) + "\n")
    code, out = _validate(p)
    assert code == 1 and "aliases counted expanded" in _one_line(out)


def test_markup_in_a_file_is_printed_not_interpreted(tmp_path: Path) -> None:
    p = tmp_path / "markup.yaml"
    p.write_text("rules: [/red] [\n")
    code, out = _validate(p)
    assert code == 1 and "not valid YAML" in out and "[/red]" in out


def test_policy_option_of_other_commands_uses_the_same_bounds(tmp_path: Path) -> None:
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"paused: \xff\n")
    r = runner.invoke(app, ["policy", "explain", "--xid", "79", "--policy", str(p)])
    assert r.exit_code == 2 and "not UTF-8 text" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(
    "command", [["sim", "--days", "0.01"], ["agent", "--backend", "simulated"]]
)
def test_every_policy_option_reads_within_the_bounds(tmp_path: Path, command: list[str]) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"dryRun: false\nnote: caf\xe9\n")
    r = runner.invoke(app, [*command, "--policy", str(bad)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert "UTF-8" in r.output
