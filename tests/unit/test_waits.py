"""gpufleet.waits: a cancellation that arrives as the awaited work ends still ends the task.

``asyncio.wait_for`` on Python 3.11 loses it (decision 0294): a service loop waiting for its
wake-up event never saw the cancellation of a clean stop. The race is made here on purpose,
in one step of the event loop: the event is set and the waiting task cancelled together.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable

import pytest

from gpufleet.waits import wait_set, within


async def _loop_until_cancelled(wait: Callable[[asyncio.Event], Awaitable[object]]) -> int:
    """A service loop's shape: wait for the wake-up (or the interval), clear it, go on."""
    event = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            await wait(event)
            event.clear()
            rounds += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)  # the loop now waits
    event.set()
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=1.0)
    if not done:
        task.cancel()  # the first cancellation was lost: end it for the report
        await asyncio.gather(task, return_exceptions=True)
        return -1
    assert task.cancelled()
    return rounds


def test_a_cancellation_as_the_event_is_set_ends_the_loop() -> None:
    assert asyncio.run(_loop_until_cancelled(lambda e: wait_set(e, 30))) == 0


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 changed asyncio.wait_for")
def test_the_race_is_real_with_asyncio_wait_for() -> None:
    """The same loop over ``asyncio.wait_for`` keeps running: what the ban is for."""
    wait_for = asyncio.wait_for  # noqa: TID251

    async def old(e: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await wait_for(e.wait(), 30)

    assert asyncio.run(_loop_until_cancelled(old)) == -1


def test_wait_set_says_whether_the_event_came() -> None:
    async def main() -> tuple[bool, bool]:
        event = asyncio.Event()
        missed = await wait_set(event, 0.01)
        asyncio.get_running_loop().call_later(0.01, event.set)
        return missed, await wait_set(event, 5)

    assert asyncio.run(main()) == (False, True)


def test_within_gives_the_result_or_times_out() -> None:
    async def main() -> int:
        with pytest.raises(TimeoutError):
            await within(0.01, asyncio.sleep(5))
        return await within(5, asyncio.sleep(0, result=7))

    assert asyncio.run(main()) == 7


def test_within_raises_a_cancellation_that_comes_as_the_work_ends() -> None:
    async def main() -> bool:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(within(30, fut))
        await asyncio.sleep(0)
        fut.set_result(1)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return task.cancelled()

    assert asyncio.run(main())
