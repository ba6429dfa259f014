"""``gpufleet health check --slurm MODE``: the node checks as Slurm runs them.

Slurm runs a program on the node as ``HealthCheckProgram`` (every
``HealthCheckInterval``), as ``Prolog`` (before a job starts on the node) and
as ``Epilog`` (after it ends). Slurm 22.05 waits for a prolog without a time
limit, so a hung check would hang the job's start: here every run is bounded.

What each outcome does (decision 0094):

=================  =======================  ==========================  ==============
check outcome      drain the node           prolog exit                 epilog / health
=================  =======================  ==========================  ==============
OK, WARNING        no                       0 (the job runs)            0 / the status
CRITICAL           yes, ``gpufleet: health  1 (Slurm requeues the job   0 / 2
                   <check>: <why>``         elsewhere)
UNKNOWN            no                       0                           0 / 3
=================  =======================  ==========================  ==============

UNKNOWN covers "could not tell": a check that did not finish within
``timeout_s`` (killed with its process group), a check program that crashed
or printed no verdict, a failed drain. gpufleet's own failure is never a
verdict on the node, so it never drains a node and never fails a job; it is
logged on stderr (slurmd's log) for people to see.

The checks run in a child process (a fork of ``gpufleet health check`` that
prints its JSON verdict), so a check stuck in a system call (NVML on a wedged
GPU) can be killed. The whole
run takes at most ``timeout_s`` for the checks plus :data:`SCONTROL_TIMEOUT_S`
for each of the two ``scontrol`` calls of a drain.

A node that is already drained is not drained again, so a failing check on a
node the syncer has taken over (``gpufleet: state remediating``) keeps its reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.health.results import CheckStatus

SCONTROL_TIMEOUT_S = 5.0
"""Bound of one ``scontrol`` call (read the node, drain it)."""
MAX_REASON_LEN = 120
"""Slurm keeps reasons as free text; ours are cut so ``sinfo -R`` stays readable."""


class Mode(StrEnum):
    """Where Slurm runs the check."""

    HEALTH = "health"
    """``HealthCheckProgram``: Slurm ignores the exit code; the program drains."""
    PROLOG = "prolog"
    """``Prolog``: a non-zero exit requeues the job (``nohold_on_prolog_fail``)."""
    EPILOG = "epilog"
    """``Epilog``: the job is over; a non-zero exit would only add Slurm's own drain."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One bounded run of the checks."""

    status: CheckStatus
    summary: str
    """The failing checks and why (for a drain reason), or why there is no verdict."""
    seconds: float


@dataclass(frozen=True, slots=True)
class HookResult:
    outcome: Outcome
    drained: bool
    exit_code: int
    note: str = ""


def run_checks(argv: Sequence[str], timeout_s: float) -> Outcome:
    """Run ``argv`` (a ``gpufleet health check --json`` command) for at most ``timeout_s``.

    The child runs in its own process group, which is killed at the bound. Any
    output that is not the JSON verdict is UNKNOWN.
    """
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        return Outcome(CheckStatus.UNKNOWN, f"cannot run the checks: {exc}", 0.0)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        spent = time.monotonic() - started
        return Outcome(
            CheckStatus.UNKNOWN, f"the checks did not finish within {timeout_s:g}s", spent
        )
    spent = time.monotonic() - started
    return parse_verdict(out.decode(errors="replace"), err.decode(errors="replace"), spent)


def run_in_fork(body: Callable[[], object], timeout_s: float) -> Outcome:
    """Run ``body`` (which prints the checks' JSON verdict) in a forked child, bounded.

    Like :func:`run_checks`, but the child is a fork of this process, which has
    already started Python and imported gpufleet: a prolog pays for that once,
    not twice. The child gets its own session; at the bound the session is killed.
    """
    started = time.monotonic()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 0
        try:
            os.setsid()
            os.close(out_r)
            os.close(err_r)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            # whatever sys.stdout was (a test's capture), the verdict goes to the pipe
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            body()
        except SystemExit:
            pass
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)
    os.close(out_w)
    os.close(err_w)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    open_fds = [out_r, err_r]
    deadline = started + timeout_s
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select(open_fds, [], [], left)
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                chunks[fd].append(data)
            else:
                open_fds.remove(fd)
    timed_out = bool(open_fds)
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    os.close(out_r)
    os.close(err_r)
    spent = time.monotonic() - started
    if timed_out:
        return Outcome(
            CheckStatus.UNKNOWN, f"the checks did not finish within {timeout_s:g}s", spent
        )
    out = b"".join(chunks[out_r]).decode(errors="replace")
    err = b"".join(chunks[err_r]).decode(errors="replace")
    return parse_verdict(out, err, spent)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def parse_verdict(stdout: str, stderr: str, seconds: float) -> Outcome:
    """The verdict from ``gpufleet health check --json`` output (UNKNOWN if there is none)."""
    try:
        doc = json.loads(stdout)
        label = str(doc["status"])
        checks = list(doc.get("checks") or [])
    except (ValueError, KeyError, TypeError):
        last = (stderr.strip().splitlines() or ["no output"])[-1]
        return Outcome(CheckStatus.UNKNOWN, f"the check program gave no verdict: {last}", seconds)
    status = {"pass": CheckStatus.OK, "warn": CheckStatus.WARNING, "fail": CheckStatus.CRITICAL}
    found = status.get(label, CheckStatus.UNKNOWN)
    bad = [c for c in checks if isinstance(c, Mapping) and c.get("status") == label]
    if found in (CheckStatus.WARNING, CheckStatus.CRITICAL) and bad:
        summary = "; ".join(f"{c.get('name')}: {c.get('reason')}" for c in bad)
    else:
        summary = str(doc.get("reason") or label)
    return Outcome(found, summary, seconds)


def drain_reason(summary: str) -> str:
    """``gpufleet: health <check>: <why>``, one line, cut to :data:`MAX_REASON_LEN`."""
    # Here, not at the top: the module's Mode names an option of `gpufleet health check`,
    # whose --help should not build the policy's pydantic models (docs/cli.md, start-up).
    from gpufleet.domain.slurm_reasons import HEALTH_CHECK_PREFIX

    text = " ".join(summary.split())
    return f"{HEALTH_CHECK_PREFIX} {text}"[:MAX_REASON_LEN]


def run_scontrol(args: Sequence[str], scontrol: str) -> subprocess.CompletedProcess[str]:
    """One ``scontrol`` call, bounded by :data:`SCONTROL_TIMEOUT_S`, never reading stdin
    (the hook and the gang preflight call Slurm only through this)."""
    return subprocess.run(
        [scontrol, *args],
        capture_output=True,
        text=True,
        timeout=SCONTROL_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def drain_node(node: str, reason: str, scontrol: str = "scontrol") -> tuple[bool, str]:
    """Drain ``node`` unless it is drained already; (drained now, what happened)."""
    try:
        shown = run_scontrol(["show", "node", node, "-o"], scontrol)
        if shown.returncode != 0:
            return False, f"cannot read node {node}: {_last_line(shown.stderr)}"
        state = next(
            (w.split("=", 1)[1] for w in shown.stdout.split() if w.startswith("State=")), ""
        )
        if "DRAIN" in state.upper().split("+"):
            return False, f"node {node} is drained already ({state})"
        done = run_scontrol(
            ["update", f"nodename={node}", "state=DRAIN", f"reason={reason}"], scontrol
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"scontrol failed: {exc}"
    if done.returncode != 0:
        return False, f"drain refused: {_last_line(done.stderr)}"
    return True, f"node {node} drained: {reason}"


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or ["no message"])[-1]


def exit_code(mode: Mode, status: CheckStatus) -> int:
    """What Slurm sees: only a CRITICAL prolog stops the job (so it starts elsewhere)."""
    if mode is Mode.PROLOG:
        return 1 if status is CheckStatus.CRITICAL else 0
    if mode is Mode.EPILOG:
        return 0
    return int(status)


def run_hook(
    mode: Mode,
    node: str,
    checks: Sequence[str] | Callable[[], object],
    *,
    timeout_s: float,
    drain: bool = True,
    scontrol: str = "scontrol",
) -> HookResult:
    """Run the checks bounded (a command, or a function run in a fork); drain on
    CRITICAL; the exit code for Slurm."""
    outcome = run_in_fork(checks, timeout_s) if callable(checks) else run_checks(checks, timeout_s)
    drained, note = False, ""
    if outcome.status is CheckStatus.CRITICAL and drain:
        drained, note = drain_node(node, drain_reason(outcome.summary), scontrol)
    return HookResult(outcome, drained, exit_code(mode, outcome.status), note)


def log_line(mode: Mode, node: str, result: HookResult) -> str:
    """One line for slurmd's log (stderr of the program)."""
    o = result.outcome
    text = (
        f"gpufleet health check --slurm {mode} node={node} status={o.status.label} "
        f"seconds={o.seconds:.2f} exit={result.exit_code}: {o.summary}"
    )
    return f"{text} ({result.note})" if result.note else text
