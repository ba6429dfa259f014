"""A long-running command's body: its loop and (with a Lease) the Lease holder until SIGTERM or
SIGINT, the one way ``gpufleet pod-scheduler`` and ``gpufleet tenant-controller`` run."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gpufleet.kubeapi.leadership import Leadership


async def run_until_signalled(
    main: Coroutine[Any, Any, None],
    leadership: Leadership | None,
    wake: asyncio.Event,
    log: logging.Logger,
) -> None:
    """Run ``main`` (and ``leadership``, which sets ``wake`` when it starts leading) until a
    signal or until either ends; an exception of either is raised. A held Lease is released on
    the way out (the holder's own ``stopped``), so a standby takes over at once."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(main)]
    if leadership is not None:

        async def on_lead() -> None:
            wake.set()

        def on_lose(why: str) -> None:
            log.warning("no longer acting: %s", why)

        lead: Callable[[], Awaitable[None]] = on_lead
        tasks.append(
            asyncio.create_task(leadership.run(lead, on_lose, stopped=lambda: stop.is_set()))
        )
    waiter = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([*tasks, waiter], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not waiter and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        await _end([*tasks, waiter], log)


STOP_ROUNDS = 3
"""How many times the tasks are cancelled on the way out, each round waited for
:data:`STOP_WAIT_S`: a task that lost one cancellation (decision 0294) gets another."""
STOP_WAIT_S = 10.0
"""Long enough for the Lease's release (a read and a write) on a busy apiserver."""


async def _end(tasks: list[asyncio.Task[Any]], log: logging.Logger) -> None:
    """Cancel ``tasks`` and wait for them; cancelled again while any is left, for at most
    :data:`STOP_ROUNDS` rounds. A cancellation lost once does not hold the stop; a task
    that outlives every round is named in the log, and the stop goes on without it."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(STOP_ROUNDS):
        if not pending:
            break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=STOP_WAIT_S)
    if pending:
        names = ", ".join(sorted(t.get_name() for t in pending))
        log.error(
            "%d task(s) still running %.0f s after the stop, left behind: %s",
            len(pending),
            STOP_ROUNDS * STOP_WAIT_S,
            names,
        )
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: an error of a task that ended is not re-logged
