"""Run one function in a short-lived child process and return its result.

The active checks' GPU work (GEMM, device copies) runs here, never in the
agent's own process. Measured on an H100: once a process has run a CUDA
kernel it holds a CUDA context, which NVML lists as a running compute
process until the process exits. An agent that ran its GEMM in-process
would pin GPU memory on every GPU under the node's jobs, make every later
"are GPU processes running?" guard answer yes (it saw itself: the active
checks after the first, and every GPU reset, were refused), and keep
``nvidia-smi --gpu-reset`` from running. A child that exits releases all
of it; the child also bounds the work in time, so a GPU that hangs a
kernel fails the check instead of hanging the agent.

Spawned, not forked: a fork of a process that touched CUDA is unusable,
and the agent's threads must not be copied.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from gpufleet.health.hardware import HardwareError

T = TypeVar("T")

_KILL_GRACE_S = 10.0


def _serve(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Child side: run ``fn(*args)`` and send ``(ok, value-or-reason)`` once."""
    try:
        value: Any = fn(*args)
        answer: tuple[bool, Any] = (True, value)
    except BaseException as exc:  # everything goes back as text: the parent decides
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" at {last[0].filename}:{last[0].lineno}" if last else ""
        answer = (False, f"{type(exc).__name__}: {exc}{where}")
    try:
        conn.send(answer)
    finally:
        conn.close()


def call(fn: Callable[..., T], args: tuple[Any, ...], *, what: str, timeout_s: float) -> T:
    """``fn(*args)`` in a spawned child; its return value must pickle.

    Raises :class:`HardwareError` when the child raised (with its exception's
    type and message), died without an answer (a crash, an out-of-memory
    kill), or did not answer within ``timeout_s`` (the child is then killed).
    The child has exited, and its GPU resources are released, when this returns.
    """
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_serve, args=(sender, fn, args), name=f"gpufleet-{what}")
    child.start()
    sender.close()  # only the child writes; EOF reaches us when it dies
    answered = False
    try:
        if not receiver.poll(timeout_s):
            raise HardwareError(f"{what} did not finish in {timeout_s:g}s; its process was killed")
        answered = True
        try:
            ok, value = receiver.recv()
        except EOFError:
            child.join(_KILL_GRACE_S)
            raise HardwareError(
                f"{what}: its process exited without an answer (exit code {child.exitcode})"
            ) from None
    finally:
        receiver.close()
        if answered:
            child.join(_KILL_GRACE_S)  # it exits right after answering
        if child.is_alive():
            child.kill()
            child.join()
    if not ok:
        raise HardwareError(f"{what} failed: {value}")
    result: T = value
    return result
