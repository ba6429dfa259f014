"""Requests in flight, the urgent ones first: a fault's isolating write never queues
behind the work that follows earlier faults.

A long-running service bounds its requests in flight (``max_in_flight``: a burst must not
open a TLS connection per request). In a burst of faults the lifecycle controller's record
writes (the cordon) and the work that follows each stored decision (the drain's reads,
Events, NodeRemediation copies) share those slots; first come, first served, the cordon
of the 30th fault waited behind the after-work of the first 29. Here a request made under
:func:`urgent` takes the next free slot before any ordinary one, and ordinary requests
start only while none is waiting (decision 0292). Urgent requests may also use
``reserve`` slots beyond the bound, so one arriving when every slot is held by ordinary
work does not wait for one of them to end.

Nothing is dropped or reordered within a class: each class is first in, first out, and
ordinary work goes on as soon as no urgent request waits (it cannot starve unless urgent
requests never stop coming, which is the case where it should wait).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import AsyncIterator, Iterator

_URGENT: contextvars.ContextVar[bool] = contextvars.ContextVar("gpufleet_urgent", default=False)


@contextlib.contextmanager
def urgent() -> Iterator[None]:
    """Requests made inside (this task only) go before ordinary ones.

    Set around one await, not around a handler: a task spawned inside copies the context,
    and the work that follows a decision must stay ordinary."""
    token = _URGENT.set(True)
    try:
        yield
    finally:
        _URGENT.reset(token)


def is_urgent() -> bool:
    """Whether the current task is inside :func:`urgent`."""
    return _URGENT.get()


class Slots:
    """At most ``size`` ordinary requests in flight, ``size + reserve`` with urgent ones;
    a free slot goes to the oldest urgent waiter, then to the oldest ordinary one."""

    def __init__(self, size: int, reserve: int = 0) -> None:
        if size < 1 or reserve < 0:
            raise ValueError(f"slots need size >= 1 and reserve >= 0, not {size}, {reserve}")
        self.size = size
        self.reserve = reserve
        self.busy = 0
        """Requests in flight now."""
        self._waiting: dict[bool, deque[asyncio.Future[None]]] = {True: deque(), False: deque()}

    def waiting(self, urgent: bool) -> int:
        """Requests of that class waiting for a slot."""
        return sum(1 for f in self._waiting[urgent] if not f.done())

    def _room(self, urgent: bool) -> bool:
        if urgent:
            return self.busy < self.size + self.reserve
        return self.busy < self.size and not self.waiting(True)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """One slot for the request made inside, urgent or not by the calling task."""
        await self._acquire(is_urgent())
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, urgent: bool) -> None:
        queue = self._waiting[urgent]
        if not queue and self._room(urgent):
            self.busy += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            await waiter  # resolved by _wake, which counted the slot as ours
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot just as we were cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    queue.remove(waiter)
                self._wake()  # an ordinary waiter may have been held back by this one
            raise

    def _release(self) -> None:
        self.busy -= 1
        self._wake()

    def _wake(self) -> None:
        for urgent in (True, False):
            queue = self._waiting[urgent]
            while queue and self._room(urgent):
                waiter = queue.popleft()
                if waiter.done():  # cancelled while waiting
                    continue
                self.busy += 1
                waiter.set_result(None)
