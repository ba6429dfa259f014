"""The background tasks of one controller process, and the ones that act.

Every collaborator spawns its background work (drains, BMC steps, Events,
ticket calls, status saves) through a :class:`TaskGroup`, so the process
knows what it has in flight. Work that can change a node (a drain, a step the
gate carries out, a ticket call) is spawned as *acting*: when the replica stops
acting (the policy paused, its lease lost) those tasks are cancelled at once
instead of running on (docs/decisions/0141).

Work that undoes what an ended act of this controller left on a machine (a reimage's
one-time network boot, its action mark) is spawned as *restoring*: a lost lease ends it
(another replica may be arming that boot for its own reimage), a pause does not. Cancelled
by a pause, it left the machine set to reimage itself at whatever reset came next, an
operator's own among them, for as long as the pause lasted (decision 0295).
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
        self._restoring: set[asyncio.Task[Any]] = set()

    @property
    def pending(self) -> frozenset[asyncio.Task[Any]]:
        """Every task not finished yet (tests wait on them)."""
        return frozenset(self._tasks)

    def spawn(
        self,
        coro: Coroutine[Any, Any, Any],
        what: str,
        *,
        acting: bool = False,
        restoring: bool = False,
    ) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; ``acting``: cancelled by :meth:`stop_acting`
        and :meth:`stop_leading`; ``restoring``: by :meth:`stop_leading` only."""
        if acting and restoring:
            raise ValueError(f"{what}: a task is acting or restoring, not both")
        task = asyncio.get_running_loop().create_task(coro, name=what)
        self._tasks.add(task)
        if acting:
            self._acting.add(task)
        if restoring:
            self._restoring.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            self._acting.discard(t)
            self._restoring.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed: %s", what, t.exception())

        task.add_done_callback(done)
        return task

    def stop_acting(self, why: str) -> int:
        """Cancel every acting task (a paused or dry-run policy); returns how many. The
        restoring ones run on."""
        return self._stop(list(self._acting), why)

    def stop_leading(self, why: str) -> int:
        """Cancel every acting and restoring task (a lost lease, a stop); returns how
        many."""
        return self._stop([*self._acting, *self._restoring], why)

    @staticmethod
    def _stop(tasks: list[asyncio.Task[Any]], why: str) -> int:
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
