"""Requests in flight, urgent ones first (decision 0292): the order in which waiting
requests get a slot, the bound each class keeps, and what a cancelled waiter leaves."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.kubeapi.slots import Slots, is_urgent, urgent


class Gate:
    """Requests that hold their slot until the test lets them end, in the order started."""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.started: list[str] = []
        self.release: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def request(self, name: str, *, hurry: bool = False) -> None:
        self.release[name] = asyncio.Event()

        async def run() -> None:
            if hurry:
                with urgent():
                    await self._hold(name)
            else:
                await self._hold(name)

        self.tasks[name] = asyncio.get_running_loop().create_task(run())

    async def _hold(self, name: str) -> None:
        async with self.slots.hold():
            self.started.append(name)
            await self.release[name].wait()

    async def end(self, name: str) -> None:
        self.release[name].set()
        await self.tasks[name]
        await settle()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_waiting_urgent_request_goes_before_ordinary_ones_that_came_first() -> None:
    async def main() -> list[str]:
        gate = Gate(Slots(2))
        gate.request("a")
        gate.request("b")
        await settle()
        gate.request("c")
        gate.request("d")
        gate.request("cordon", hurry=True)  # the reserve is 0: it waits too
        await settle()
        assert gate.started == ["a", "b"]
        await gate.end("a")
        assert gate.started == ["a", "b", "cordon"]
        await gate.end("b")
        await gate.end("cordon")
        assert gate.started == ["a", "b", "cordon", "c", "d"]  # ordinary ones in their order
        for name in ("c", "d"):
            await gate.end(name)
        return gate.started

    asyncio.run(main())


def test_the_reserve_serves_urgent_requests_only() -> None:
    async def main() -> None:
        slots = Slots(2, reserve=1)
        gate = Gate(slots)
        for name in ("a", "b", "c"):
            gate.request(name)
        await settle()
        assert gate.started == ["a", "b"]  # the third ordinary request waits: bound 2
        gate.request("cordon", hurry=True)
        await settle()
        assert gate.started == ["a", "b", "cordon"]  # into the reserve at once
        assert slots.busy == 3
        gate.request("cordon2", hurry=True)
        await settle()
        assert "cordon2" not in gate.started  # the reserve is full too
        await gate.end("a")
        assert gate.started[-1] == "cordon2"  # before the ordinary "c"
        await gate.end("b")
        assert slots.busy == 2  # the ordinary one waits while three are in flight
        assert "c" not in gate.started
        await gate.end("cordon")
        assert gate.started[-1] == "c"
        await gate.end("cordon2")
        await gate.end("c")
        assert slots.busy == 0

    asyncio.run(main())


def test_ordinary_requests_wait_while_an_urgent_one_waits_even_with_room() -> None:
    """No ordinary request slips past a waiting urgent one into a slot it could use."""

    async def main() -> None:
        slots = Slots(3)
        gate = Gate(slots)
        for name in ("a", "b", "c"):
            gate.request(name)
        await settle()
        gate.request("cordon", hurry=True)
        await settle()
        await gate.end("a")  # one slot free: the urgent one takes it
        gate.request("d")
        await settle()
        assert gate.started == ["a", "b", "c", "cordon"]
        await gate.end("b")
        assert gate.started[-1] == "d"
        for name in ("c", "cordon", "d"):
            await gate.end(name)

    asyncio.run(main())


def test_a_cancelled_waiter_gives_its_place_to_the_next() -> None:
    async def main() -> None:
        slots = Slots(1)
        gate = Gate(slots)
        gate.request("a")
        await settle()
        gate.request("cordon", hurry=True)
        gate.request("b")
        await settle()
        gate.tasks["cordon"].cancel()
        await settle()
        assert slots.waiting(True) == 0
        await gate.end("a")
        assert gate.started == ["a", "b"]  # not held back by the urgent one that left
        await gate.end("b")
        assert slots.busy == 0

    asyncio.run(main())


def test_a_failing_request_gives_its_slot_back() -> None:
    async def main() -> None:
        slots = Slots(1)

        async def fails() -> None:
            async with slots.hold():
                raise RuntimeError("answered 500")

        with pytest.raises(RuntimeError):
            await fails()
        assert slots.busy == 0
        async with slots.hold():
            assert slots.busy == 1

    asyncio.run(main())


def test_urgency_belongs_to_the_task_that_asked_and_ends_with_the_block() -> None:
    async def main() -> None:
        seen: list[bool] = []

        async def child() -> None:
            seen.append(is_urgent())

        with urgent():
            assert is_urgent()
        assert not is_urgent()
        await asyncio.gather(child())
        assert seen == [False]

    asyncio.run(main())


@pytest.mark.parametrize(("size", "reserve"), [(0, 0), (2, -1)])
def test_bad_bounds_are_refused(size: int, reserve: int) -> None:
    with pytest.raises(ValueError, match="slots need"):
        Slots(size, reserve)
