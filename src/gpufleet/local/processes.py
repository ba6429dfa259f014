"""Child processes of the local cluster: spawn, wait until ready, stop.

Every component runs in its own session (process group) with its output in a
log file under the run directory. Stopping sends SIGTERM to the whole group,
then SIGKILL after a grace period, so helpers a daemon forks (slurmstepd, job
scripts) go too. A final sweep kills anything still running whose command line
or working directory points into the run directory: Slurm job steps leave their
daemon's process group, and a cluster must never leave a process behind.

Processes are identified by pid *and* kernel start time, so a ``down`` issued
from another process (the CLI) never signals a recycled pid.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any


class ComponentError(RuntimeError):
    """A component failed to start or become ready.

    The message names the component and its log file, and ends with the last
    lines of that log, because that is the first thing a user needs to look at.
    """

    def __init__(self, component: str, log: Path | None, reason: str) -> None:
        self.component = component
        self.log = log
        detail = ""
        if log is not None:
            tail = tail_lines(log, 15)
            detail = f"\n  log file: {log}" + (
                "\n  last lines:\n    " + "\n    ".join(tail) if tail else ""
            )
        super().__init__(f"{component}: {reason}{detail}")


def tail_lines(path: Path, count: int) -> list[str]:
    """Last ``count`` lines of a text file (empty if it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return data.splitlines()[-count:]


LISTEN_PORTS = range(10000, 20000)
"""Where :func:`free_ports` looks: below the kernel's ephemeral range (32768-60999
by default), so that no outgoing connection (apiserver to etcd, srun, gloo) takes a
port between the moment it is chosen and the moment its server binds it; and below
the example job's rendezvous ports (20000-31999)."""


def _ephemeral_range() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


_HANDED_OUT: set[int] = set()
"""Every port :func:`free_ports` returned in this process. A port is chosen long before
its server binds it (the demo picks its agents' ports, then starts the whole cluster,
whose daemons pick and bind theirs), so a check by binding alone would hand one port
to two servers; a port is therefore never handed out twice by one process."""
_HANDED_OUT_LOCK = threading.Lock()


def free_ports(count: int, *, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct TCP ports that are free on 127.0.0.1 right now.

    Chosen at random in :data:`LISTEN_PORTS` outside the ephemeral range, each
    checked by binding it, and never one this process handed out before (its server
    may not have bound it yet); all sockets are held open until every port is chosen,
    so the ports are distinct. Another process may still take one before we bind it
    (the same small race envtest accepts), but no client connection can. Falls back
    to a kernel-chosen port when the range is crowded.
    """
    pick = rng or random.SystemRandom()
    ephemeral = _ephemeral_range()
    candidates = [p for p in LISTEN_PORTS if p not in ephemeral]
    socks: list[socket.socket] = []
    with _HANDED_OUT_LOCK:
        try:
            for _ in range(count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                for _attempt in range(50):
                    port = pick.choice(candidates) if candidates else 0
                    if port in _HANDED_OUT:
                        continue
                    try:
                        s.bind(("127.0.0.1", port))
                        break
                    except OSError:
                        continue
                else:
                    s.bind(("127.0.0.1", 0))
            ports = [s.getsockname()[1] for s in socks]
            _HANDED_OUT.update(ports)
            return ports
        finally:
            for s in socks:
                s.close()


def start_time_of(pid: int) -> int | None:
    """The kernel start time of ``pid`` (clock ticks since boot), or None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has finished; it only waits to be reaped
        return None
    return int(fields[19])


@dataclass(frozen=True)
class ProcessRecord:
    """What is needed to find a process again, possibly from another process."""

    name: str
    pid: int
    start_time: int
    log: str

    def alive(self) -> bool:
        return start_time_of(self.pid) == self.start_time


class ManagedProcess:
    """One component process, in its own process group, logging to a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str | os.PathLike[str]],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log = log
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self._popen: subprocess.Popen[bytes] | None = None
        self.record: ProcessRecord | None = None

    def start(self) -> ManagedProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"# {' '.join(self.argv)}\n".encode())
            out.flush()
            try:
                self._popen = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ComponentError(
                    self.name, self.log, f"cannot execute {self.argv[0]}: {exc}"
                ) from exc
        pid = self._popen.pid
        self.record = ProcessRecord(self.name, pid, start_time_of(pid) or 0, str(self.log))
        return self

    @property
    def pid(self) -> int:
        assert self._popen is not None, f"{self.name} was never started"
        return self._popen.pid

    def poll(self) -> int | None:
        """Exit code if the process has exited, else None."""
        return None if self._popen is None else self._popen.poll()

    def wait_ready(
        self,
        check: Callable[[], bool],
        *,
        timeout: float,
        what: str = "ready",
        interval: float = 0.1,
    ) -> None:
        """Poll ``check`` until it returns True; fail fast if the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                raise ComponentError(
                    self.name, self.log, f"exited with code {code} before it was {what}"
                )
            with contextlib.suppress(Exception):
                if check():
                    return
            if time.monotonic() > deadline:
                raise ComponentError(self.name, self.log, f"not {what} after {timeout:.0f} s")
            time.sleep(interval)

    def stop(self, grace: float = 5.0) -> None:
        if self.record is not None:
            stop_records([self.record], grace=grace)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=1)


def _signal_group(record: ProcessRecord, sig: signal.Signals) -> None:
    if not record.alive():
        return
    # Each component leads its own session, so its pgid is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(record.pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(record.pid, sig)


def stop_records(records: Sequence[ProcessRecord], *, grace: float = 5.0) -> None:
    """SIGTERM every record's process group, wait up to ``grace`` s, then SIGKILL.

    All groups are signalled at once so the total wait is one grace period,
    not one per component.
    """
    for r in records:
        _signal_group(r, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(r.alive() for r in records):
        time.sleep(0.05)
    for r in records:
        if r.alive():
            _signal_group(r, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(r.alive() for r in records):
        time.sleep(0.02)


COMPONENT_EXECUTABLES = frozenset(
    {
        "etcd",
        "kube-apiserver",
        "kube-scheduler",
        "kube-controller-manager",
        "kwok",
        "munged",
        "slurmctld",
        "slurmd",
        "slurmstepd",
        "slurmrestd",
        # The local cluster's machines (their console log is in the run directory).
        "qemu-system-x86_64",
    }
)


def _ancestors() -> set[int]:
    """This process and its ancestors: never swept, even if their argv names the run dir."""
    pids = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
        pids.add(pid)
    return pids


def processes_using(path: Path) -> list[int]:
    """Pids of cluster processes tied to the run directory ``path``.

    A process counts when it runs a Slurm job script from the spool under
    ``path``, when it belongs to a job of this cluster (its environment has a
    ``SLURM_JOB_ID`` and points ``SLURM_CONF`` into ``path``: job scripts,
    ``srun`` and job steps started from elsewhere; a user's shell that merely
    exported ``SLURM_CONF`` is not a job and is left alone), or when it is a
    known component executable (or our own Redfish emulator) whose command line
    names ``path``, whose working directory is inside it, or whose environment
    points ``SLURM_CONF`` into it: a batch job's ``slurmstepd: [N.batch]`` names
    neither the run directory nor runs in it (it moves to the job's working
    directory), and it leaves slurmd's process group, but it inherits slurmd's
    environment. A user's shell or
    ``tail -f`` in the run directory is left alone. Job steps and job scripts run in sessions of
    their own, so group kills miss them; this finds them.
    """
    root = str(path.resolve())
    conf = f"SLURM_CONF={root}/".encode()
    skip = _ancestors()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        pid = int(entry.name)
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if start_time_of(pid) is None or not argv or not argv[0]:
            continue
        cmdline = b" ".join(argv).decode("utf-8", "replace")
        exe = os.path.basename(argv[0].decode("utf-8", "replace")).split(":")[0]
        ours = (
            exe in COMPONENT_EXECUTABLES
            or "gpufleet.local.redfish" in cmdline
            or "gpufleet.cli.main provision serve" in cmdline
        )
        inside = cwd == root or cwd.startswith(root + "/")
        env = _environ(entry)
        job = f"{root}/slurm/spool/" in cmdline or _in_job(env, conf)
        if job or (ours and (inside or root in cmdline or _has(env, conf))):
            found.append(pid)
    return found


def _environ(entry: Path) -> list[bytes]:
    try:
        return (entry / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def _has(env: list[bytes], prefix: bytes) -> bool:
    return any(item.startswith(prefix) for item in env)


def _in_job(env: list[bytes], conf: bytes) -> bool:
    """Whether the process's environment is that of a Slurm job of this cluster."""
    return _has(env, conf) and _has(env, b"SLURM_JOB_ID=")


def _kill(pid: int, sig: signal.Signals) -> None:
    """Signal ``pid``, and its whole group when it leads one (a job script and its children)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid and pid != os.getpgid(0):
            os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def end(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM a child, give it ``grace`` seconds, then SIGKILL; reaped either way."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def sweep(path: Path, *, grace: float = 2.0) -> list[int]:
    """Kill every process still tied to ``path``; return the pids it found."""
    pids = processes_using(path)
    for pid in pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(start_time_of(p) is not None for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if start_time_of(pid) is not None:
            _kill(pid, signal.SIGKILL)
    return pids


@contextlib.contextmanager
def terminate_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into SystemExit while the block runs.

    Python runs ``finally`` blocks and context-manager exits on SystemExit and
    on KeyboardInterrupt (Ctrl-C), but not on a bare SIGTERM; with this in
    place a killed ``gpufleet local up --foreground`` or test run still stops
    its cluster. Only works in the main thread; elsewhere it does nothing.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
