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
        for task in [*tasks, waiter]:
            task.cancel()
        await asyncio.gather(*tasks, waiter, return_exceptions=True)
