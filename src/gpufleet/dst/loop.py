"""A deterministic asyncio event loop: virtual time, a seeded ready queue, no real waiting.

Why a loop of our own: the products under test are plain asyncio code that waits
with ``asyncio.sleep``, ``wait_for`` and futures. Run on this loop they never
wait for real: when nothing is ready, time jumps to the next timer. Which of the
callbacks that are ready together runs first is decided by a seeded generator
(or kept first-in first-out), so a seed fixes one interleaving and replaying it
gives the same run, call for call.

Threads are the other source of nondeterminism: :meth:`DstLoop.run_in_executor`
(what ``asyncio.to_thread`` uses) runs the function inline, at once, on the loop.

Products read time through :class:`VirtualClock` (a :class:`gpufleet.clock.Clock`)
or ``loop.time()``; both are the loop's virtual seconds.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import random
from asyncio import base_events
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

EPOCH = 1_800_000_000.0
"""Wall time (``Clock.now``) at virtual second 0: a fixed date, so records and
Events carry the same numbers in every run."""


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is set: every task waits on something that never comes."""


class DstLoop(base_events.BaseEventLoop):
    """An event loop whose clock is virtual and whose ready queue is ordered by a seed.

    ``shuffle``: run the callbacks that became ready together in an order drawn from
    ``rng`` (else first-in first-out, asyncio's own order). ``on_step`` is called
    after every iteration (the invariants' hook); ``task_hook`` with every task
    created (the world files it under the process that created it).
    """

    def __init__(self, rng: random.Random, *, shuffle: bool = True) -> None:
        super().__init__()
        self._vtime = 0.0
        self._rng = rng
        self._shuffle = shuffle
        self.steps = 0
        """Iterations run (one iteration runs every callback ready at its start)."""
        self.callbacks = 0
        """Callbacks run."""
        self._seq = itertools.count()
        self._order: dict[int, int] = {}
        """id(timer) -> when it was made: timers due at the same instant run in the order
        they were set (the heap alone orders equal times by its shape, which changes when
        an unrelated timer is added or removed, as the shrinker does)."""
        self.on_step: Callable[[], None] | None = None
        self.task_hook: Callable[[asyncio.Task[Any]], None] | None = None
        self.set_task_factory(self._task_factory)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ time

    def time(self) -> float:
        return self._vtime

    # ------------------------------------------------------------ no real I/O

    def _process_events(self, event_list: Any) -> None:
        """No selector: nothing from outside ever arrives."""

    def _write_to_self(self) -> None:
        """No other thread wakes this loop."""

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        """Run ``func`` now, on the loop (a thread would run it at a time no seed fixes)."""
        fut: asyncio.Future[T] = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as exc:  # the caller awaits it and sees it
            fut.set_exception(exc)
        return fut

    def _task_factory(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any
    ) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kw)
        if self.task_hook is not None:
            self.task_hook(task)
        return task

    # -------------------------------------------------------------- schedule

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., Any], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        handle = super().call_at(when, callback, *args, context=context)
        self._order[id(handle)] = next(self._seq)
        return handle

    def _run_once(self) -> None:
        """One iteration: if nothing is ready, jump to the next timer; run what is ready."""
        base: Any = self  # BaseEventLoop's own fields, which typeshed does not declare
        scheduled = base._scheduled
        while scheduled and scheduled[0]._cancelled:
            base._timer_cancelled_count -= 1
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            self._order.pop(id(handle), None)
        if not base._ready and not base._stopping:
            if not scheduled:
                raise Deadlock(f"nothing ready and no timer at t={self._vtime:.3f}")
            self._vtime = max(self._vtime, scheduled[0]._when)
        due: list[tuple[int, Any]] = []
        while scheduled and scheduled[0]._when <= self._vtime:
            timer = heapq.heappop(scheduled)
            timer._scheduled = False
            seq = self._order.pop(id(timer), 0)
            if not timer._cancelled:
                due.append((seq, timer))
            else:
                base._timer_cancelled_count -= 1
        due.sort(key=lambda x: (x[1]._when, x[0]))
        base._ready.extend(t for _, t in due)
        todo = [base._ready.popleft() for _ in range(len(base._ready))]
        if self._shuffle and len(todo) > 1:
            self._rng.shuffle(todo)
        for handle in todo:
            if not handle._cancelled:
                self.callbacks += 1
                handle._run()
        self.steps += 1
        if self.on_step is not None:
            self.on_step()

    def run_until(self, t: float) -> None:
        """Run until virtual time ``t`` (what is due at ``t`` itself runs)."""

        def stop() -> None:
            self.stop()

        self.call_at(t, stop)
        self.run_forever()


class VirtualClock:
    """The :class:`gpufleet.clock.Clock` of a :class:`DstLoop`: both readings are its time."""

    def __init__(self, loop: DstLoop, epoch: float = EPOCH) -> None:
        self._loop = loop
        self._epoch = epoch

    def now(self) -> float:
        return self._epoch + self._loop.time()

    def monotonic(self) -> float:
        return 1_000.0 + self._loop.time()


def in_context(ctx: contextvars.Context, fn: Callable[[], T]) -> T:
    """``fn()`` run in ``ctx`` (what a task started there inherits)."""
    return ctx.run(fn)
