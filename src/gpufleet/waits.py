"""Bounded waits that a cancellation always ends.

``asyncio.wait_for`` on Python 3.11 runs the awaited work as a task of its own; when the
caller is cancelled just as that work finishes, it returns the work's result and the
cancellation is lost (CPython gh-86296, changed in 3.12). A service loop that waits for
its wake-up event that way, on a cluster busy enough that the event fires often, can miss
the cancellation of a clean stop and never end: the likely cause of a ``gpufleet
tenant-controller`` that released its Lease on SIGTERM and still ran 30 s later (seen once,
not reproduced). ``asyncio.timeout`` awaits in the caller's own task, so a cancellation is
raised where it waits. Ruff bans ``asyncio.wait_for`` in this repository (decision 0294);
these are what to use instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_set(event: asyncio.Event, seconds: float) -> bool:
    """Until ``event`` is set or ``seconds`` pass; whether it was set. A cancellation
    is raised, never taken for the event."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, seconds)):
            await event.wait()
    return event.is_set()


async def within(seconds: float, work: Awaitable[T]) -> T:
    """``work``'s result, or :class:`TimeoutError` after ``seconds``; a cancellation is
    raised, never lost because the work finished as it came."""
    async with asyncio.timeout(seconds):
        return await work
