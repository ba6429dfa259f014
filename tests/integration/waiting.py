"""The one way the integration tests wait: poll a check until it is truthy, or fail naming it.

Imported by the tests and their harnesses (``controller_harness``, ``slurm_support``) as
``from waiting import wait_for``: pytest puts this directory on ``sys.path``, as it does
for them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0, step: float = 0.1) -> Any:
    """Call ``check`` every ``step`` seconds until it returns something truthy; return that.

    Raises AssertionError naming ``what`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


async def wait_for_async(
    what: str, check: Callable[[], Any], timeout: float = 30.0, step: float = 0.1
) -> float:
    """:func:`wait_for` from a coroutine: ``check`` (blocking) runs in a worker thread, so the
    event loop (an agent under test on it) keeps running. Returns the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if await asyncio.to_thread(check):
            return time.monotonic() - start
        await asyncio.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
