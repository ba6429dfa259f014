"""Maintenance commands: the programs a MaintenancePlan may have the node's agent run.

A plan with ``action: command`` names a command (``spec.command: flash-bmc-fw``);
the node decides what that name runs: an executable file of that name in the
agent's commands directory (``--maintenance-commands``, by default
``/etc/gpufleet/maintenance.d``), put there by whoever builds the node image or
configures the agent. Whoever may write MaintenancePlans can thus choose *when*
an installed command runs and on which nodes, never *what* runs as root on
them (decision 0120).

The checks here refuse what would widen that (decision 0170): a name that is a
path; a file that is missing, not a regular file, not executable; a file, or any
directory from ``/`` down to the commands directory, that is a symbolic link,
owned by anyone but root or the agent's own user, or writable by group or others
(anyone who could edit the file, or swap it or a directory above it, could run
code as root on every node). The path is walked one component at a time with
``O_NOFOLLOW`` from ``/``, each component opened relative to the one before, so
what is checked is what was opened; the file is kept open and executed through
its descriptor (``/proc/self/fd/N``, passed to the child), so it cannot be
swapped between the check and the exec. The one exception: a directory above the
commands directory may be writable by others if it is root's and sticky (``/tmp``):
there only an entry's owner can rename or remove it, and the entries below are
checked to be root's or the agent's.

A command runs in a session of its own, with its output kept (the last
:data:`OUTPUT_TAIL` bytes) and its whole process group killed at its timeout.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

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


@dataclass(frozen=True, slots=True)
class Command:
    """An installed command that passed every check, held open: what runs is this file.

    Close it (or use it as a context manager) once it has run.
    """

    name: str
    path: Path
    fd: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def __enter__(self) -> Command:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _owners() -> frozenset[int]:
    """Who may own the file and the directories above it: root, and the agent's own user."""
    return frozenset({0, os.geteuid()})


def _unsafe(
    what: Path, st: os.stat_result, owners: Iterable[int], *, sticky_ok: bool = False
) -> str | None:
    """Why ``what`` (its ``fstat``) may not hold or be a command, or None."""
    if stat.S_ISLNK(st.st_mode):
        return f"{what} is a symbolic link: refused (install the file itself)"
    if st.st_uid not in owners:
        return f"{what} is owned by uid {st.st_uid}, not root or the agent: refused"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        if sticky_ok and st.st_mode & stat.S_ISVTX and st.st_uid == 0:
            return None  # /tmp: only an entry's owner may rename or remove it
        return f"{what} is writable by group or others: refused (chmod go-w)"
    return None


def _open_dir(directory: Path, owners: frozenset[int]) -> int | str:
    """An ``O_PATH`` descriptor of ``directory``, walked from ``/`` one component at a time
    without following a link, each component checked; or why not."""
    if not directory.is_absolute():
        return f"the commands directory {directory} is not an absolute path"
    parts = directory.parts[1:]
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    here = Path("/")
    try:
        for i, part in enumerate([None, *parts]):
            if part is not None:
                here = here / part
                try:
                    nxt = os.open(part, flags, dir_fd=fd)
                except OSError as exc:
                    return _open_failed(here, exc)
                os.close(fd)
                fd = nxt
            st = os.fstat(fd)
            if not stat.S_ISDIR(st.st_mode):
                return f"{here} is not a directory"
            why = _unsafe(here, st, owners, sticky_ok=i < len(parts))
            if why is not None:
                return why
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _open_failed(what: Path, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(what):
        return f"{what} is a symbolic link: refused (install the file itself)"
    if exc.errno == errno.ENOENT:
        return f"{what} does not exist"
    return f"{what} unreadable: {exc.strerror or exc}"


def find(directory: Path, name: str) -> Command | str:
    """The command ``name``, checked and held open; or why it may not run."""
    if not COMMAND_NAME.match(name):
        return f"{name!r} is not a command name (no paths)"
    owners = _owners()
    dir_fd = _open_dir(directory, owners)
    if isinstance(dir_fd, str):
        return dir_fd
    path = directory / name
    try:
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        except FileNotFoundError:
            offered = ", ".join(installed(directory)) or "none"
            return f"no maintenance command {name!r} in {directory} (installed: {offered})"
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"{path} is a symbolic link: refused (install the file itself)"
            return f"maintenance command {path} unreadable: {exc.strerror or exc}"
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    why: str | None = None
    if not stat.S_ISREG(st.st_mode):
        why = f"{path} is not a regular file"
    elif not st.st_mode & stat.S_IXUSR:
        why = f"{path} is not executable"
    else:
        why = _unsafe(path, st, owners)
    if why is not None:
        os.close(fd)
        return why
    return Command(name=name, path=path, fd=fd)


def run(command: Command, *, timeout_s: float, env: Mapping[str, str]) -> Outcome:
    """Run one checked command to its end or its timeout (blocking).

    The very file :func:`find` checked is executed: through its open descriptor, which
    the child keeps (an interpreter named by a ``#!`` line opens its script by that
    path), never by its name, which could point elsewhere by now.
    """
    start = time.monotonic()
    path = command.path
    full = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **env}
    try:
        proc = subprocess.Popen(
            [command.name],
            executable=f"/proc/self/fd/{command.fd}",
            pass_fds=(command.fd,),
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
