"""Maintenance commands: the programs a MaintenancePlan may have the node's agent run.

A plan with ``action: command`` names a command (``spec.command: flash-bmc-fw``);
the node decides what that name runs: an executable file of that name in the
agent's commands directory (``--maintenance-commands``, by default
``/etc/gpufleet/maintenance.d``), put there by whoever builds the node image or
configures the agent. Whoever may write MaintenancePlans can thus choose *when*
an installed command runs and on which nodes, never *what* runs as root on
them (decision 0120).

The checks here refuse what would widen that: a name that is a path, a file
that is missing, not executable, not a regular file, or writable by group or
others (anyone who could edit it could run code as root on every node). A
command runs in a session of its own, with its output kept (the last
:data:`OUTPUT_TAIL` bytes) and its whole process group killed at its timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpufleet.domain.maintenance import COMMAND_NAME

DEFAULT_DIR = Path("/etc/gpufleet/maintenance.d")
OUTPUT_TAIL = 2048
"""Bytes of a command's output (stdout and stderr together) kept for its answer."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a command ended: ``passed`` only for exit status 0 within its time."""

    passed: bool
    detail: str
    seconds: float


def installed(directory: Path) -> list[str]:
    """The command names the directory offers (for messages and ``--help``)."""
    try:
        return sorted(
            p.name for p in directory.iterdir() if COMMAND_NAME.match(p.name) and p.is_file()
        )
    except OSError:
        return []


def find(directory: Path, name: str) -> Path | str:
    """The executable for ``name``, or why it may not run."""
    if not COMMAND_NAME.match(name):
        return f"{name!r} is not a command name (no paths)"
    path = directory / name
    try:
        st = path.stat()  # follows a link: an installed command may point at a binary
    except FileNotFoundError:
        offered = ", ".join(installed(directory)) or "none"
        return f"no maintenance command {name!r} in {directory} (installed: {offered})"
    except OSError as exc:
        return f"maintenance command {path} unreadable: {exc}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if not st.st_mode & stat.S_IXUSR:
        return f"{path} is not executable"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others: refused (chmod go-w)"
    return path


def run(path: Path, *, timeout_s: float, env: Mapping[str, str]) -> Outcome:
    """Run one command to its end or its timeout (blocking)."""
    start = time.monotonic()
    full = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **env}
    try:
        proc = subprocess.Popen(
            [str(path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=full,
            cwd="/",
            start_new_session=True,
        )
    except OSError as exc:
        return Outcome(False, f"{path.name} did not start: {exc}", time.monotonic() - start)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a process that left the session holds the pipe
            out = b""
        took = time.monotonic() - start
        return Outcome(False, f"{path.name} killed after {timeout_s:.0f} s{_tail(out)}", took)
    took = time.monotonic() - start
    if proc.returncode == 0:
        return Outcome(True, f"{path.name} exited 0 in {took:.1f} s{_tail(out)}", took)
    return Outcome(False, f"{path.name} exited {proc.returncode}{_tail(out)}", took)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's session, then SIGKILL to whatever of it is left after
    5 s (a flash tool or one of its children may ignore TERM)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(out: bytes | None) -> str:
    text = (out or b"")[-OUTPUT_TAIL:].decode("utf-8", "replace").strip()
    return f": {text}" if text else ""
