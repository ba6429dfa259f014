"""The deterministic loop: virtual time, inline executor, one order per seed."""

from __future__ import annotations

import asyncio
import random

import pytest

from gpufleet.dst.loop import Deadlock, DstLoop, VirtualClock
from gpufleet.waits import within


def _run(loop: DstLoop, coro: object) -> object:
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro)  # type: ignore[arg-type]
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def test_time_jumps_to_the_next_timer_without_waiting() -> None:
    loop = DstLoop(random.Random(1))
    clock = VirtualClock(loop)

    async def main() -> tuple[float, float]:
        start = clock.now()
        await asyncio.sleep(3600)
        return loop.time(), clock.now() - start

    assert _run(loop, main()) == (3600.0, 3600.0)


def test_a_timeout_fires_in_virtual_time() -> None:
    loop = DstLoop(random.Random(1))

    async def main() -> float:
        with pytest.raises(TimeoutError):
            await within(90, asyncio.Event().wait())
        return loop.time()

    assert _run(loop, main()) == 90.0


def test_threads_run_inline_on_the_loop() -> None:
    loop = DstLoop(random.Random(1))
    seen: list[str] = []

    async def main() -> str:
        def work() -> str:
            seen.append("ran")
            return "done"

        return await asyncio.to_thread(work)

    assert _run(loop, main()) == "done"
    assert seen == ["ran"]


def _order(seed: int, shuffle: bool) -> list[int]:
    loop = DstLoop(random.Random(seed), shuffle=shuffle)
    out: list[int] = []

    async def worker(i: int) -> None:
        await asyncio.sleep(1.0)
        out.append(i)

    async def main() -> None:
        await asyncio.gather(*(worker(i) for i in range(12)))

    _run(loop, main())
    return out


def test_one_seed_one_order_and_seeds_differ() -> None:
    assert _order(7, True) == _order(7, True)
    assert len({tuple(_order(s, True)) for s in range(6)}) > 1
    assert _order(7, False) == list(range(12))  # unshuffled: asyncio's own order


def test_a_deadlock_is_an_error_not_a_hang() -> None:
    loop = DstLoop(random.Random(1))

    async def main() -> None:
        await loop.create_future()

    with pytest.raises(Deadlock):
        _run(loop, main())
