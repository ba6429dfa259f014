"""Which file a maintenance command runs, checked along its whole path (decision 0170):
no symbolic link anywhere, every directory and the file root's or the agent's and not
writable by group or others, and the file run is the file checked, even if its name is
swapped for another between the check and the exec. Real files, links and owners
(the tests run as root, as the agent does)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufleet.health import maintenance_commands as mc

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root, as the agent")


def script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


@pytest.fixture
def commands(tmp_path: Path) -> Path:
    """``<tmp>/etc/maintenance.d``: root's, 0755, under pytest's own private directories."""
    d = tmp_path / "etc" / "maintenance.d"
    d.mkdir(parents=True)
    for p in (tmp_path, tmp_path / "etc", d):
        p.chmod(0o755)
    return d


def refused(directory: Path, name: str) -> str:
    found = mc.find(directory, name)
    if isinstance(found, mc.Command):
        found.close()
        raise AssertionError(f"{name} was accepted")
    return found


def test_an_installed_file_is_found_and_runs(commands: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script(commands / "flash-fw", f"echo flashed > {marker}")
    found = mc.find(commands, "flash-fw")
    assert isinstance(found, mc.Command), found
    with found:
        outcome = mc.run(found, timeout_s=30, env={})
    assert outcome.passed, outcome.detail
    assert marker.read_text().strip() == "flashed"


def test_a_symbolic_link_as_the_command_is_refused(commands: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    target = script(tmp_path / "elsewhere", f"touch {marker}")
    (commands / "flash-fw").symlink_to(target)
    assert "flash-fw is a symbolic link: refused" in refused(commands, "flash-fw")
    assert not marker.exists()


def test_a_symbolic_link_anywhere_above_is_refused(commands: Path, tmp_path: Path) -> None:
    script(commands / "flash-fw", "exit 0")
    link = tmp_path / "via-link"
    link.symlink_to(commands.parent)
    why = refused(link / "maintenance.d", "flash-fw")
    assert f"{link} is a symbolic link" in why


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
def test_a_commands_directory_others_may_write_is_refused(commands: Path, mode: int) -> None:
    """Anyone who may write the directory may replace the file: even sticky is refused here."""
    script(commands / "flash-fw", "exit 0")
    commands.chmod(mode)
    assert f"{commands} is writable by group or others" in refused(commands, "flash-fw")


def test_a_directory_above_that_others_may_write_is_refused(commands: Path) -> None:
    script(commands / "flash-fw", "exit 0")
    commands.parent.chmod(0o777)  # they could rename maintenance.d and put their own there
    assert f"{commands.parent} is writable by group or others" in refused(commands, "flash-fw")


def test_a_sticky_directory_of_root_above_is_accepted(commands: Path) -> None:
    """/tmp-like: others may create entries but not rename or remove root's."""
    script(commands / "flash-fw", "exit 0")
    commands.parent.chmod(0o1777)
    found = mc.find(commands, "flash-fw")
    assert isinstance(found, mc.Command), found
    found.close()


def test_another_owner_of_the_file_or_a_directory_is_refused(commands: Path) -> None:
    path = script(commands / "flash-fw", "exit 0")
    os.chown(path, 4321, 4321)
    assert "flash-fw is owned by uid 4321, not root or the agent" in refused(commands, "flash-fw")
    os.chown(path, 0, 0)
    os.chown(commands.parent, 4321, 0)
    assert f"{commands.parent} is owned by uid 4321" in refused(commands, "flash-fw")


def test_a_fifo_is_refused_without_blocking(commands: Path) -> None:
    os.mkfifo(commands / "flash-fw", 0o755)
    assert "is not a regular file" in refused(commands, "flash-fw")


def test_the_file_checked_is_the_file_run_even_if_swapped(commands: Path, tmp_path: Path) -> None:
    """Between the check and the exec someone renames another file over the name: the
    command run is still the one checked (held open, executed through its descriptor)."""
    script(commands / "flash-fw", f"echo checked > {tmp_path / 'which'}")
    found = mc.find(commands, "flash-fw")
    assert isinstance(found, mc.Command), found
    evil = script(commands / ".incoming", f"echo swapped > {tmp_path / 'which'}")
    os.replace(evil, commands / "flash-fw")
    with found:
        outcome = mc.run(found, timeout_s=30, env={})
    assert outcome.passed, outcome.detail
    assert (tmp_path / "which").read_text().strip() == "checked"
    assert "flash-fw exited 0" in outcome.detail  # named by its name, not /proc/self/fd/N


def test_a_relative_commands_directory_is_refused() -> None:
    assert "not an absolute path" in refused(Path("etc/maintenance.d"), "flash-fw")
