"""The background tasks of one controller process, and the ones that act.

Every collaborator spawns its background work (drains, BMC steps, Events,
ticket calls, status saves) through a :class:`TaskGroup`, so the process
knows what it has in flight. Work that can change a node (a drain, a step the
gate carries out, a ticket call) is spawned as *acting*: when the replica stops
acting (the policy paused, its lease lost) those tasks are cancelled at once
instead of running on (docs/decisions/0141).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("gpufleet.controller")


class TaskGroup:
    """Tasks of one process: spawned, awaited on close, the acting ones cancellable."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._acting: set[asyncio.Task[Any]] = set()

    @property
    def pending(self) -> frozenset[asyncio.Task[Any]]:
        """Every task not finished yet (tests wait on them)."""
        return frozenset(self._tasks)

    def spawn(
        self, coro: Coroutine[Any, Any, Any], what: str, *, acting: bool = False
    ) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; ``acting``: cancelled by :meth:`stop_acting`."""
        task = asyncio.get_running_loop().create_task(coro, name=what)
        self._tasks.add(task)
        if acting:
            self._acting.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            self._acting.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed: %s", what, t.exception())

        task.add_done_callback(done)
        return task

    def stop_acting(self, why: str) -> int:
        """Cancel every acting task (a paused policy, a lost lease); returns how many."""
        tasks = list(self._acting)
        for task in tasks:
            task.cancel()
        if tasks:
            log.warning("stopped %d task(s) in flight: %s", len(tasks), why)
        return len(tasks)

    async def close(self) -> None:
        """Cancel everything and wait for it to end."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
