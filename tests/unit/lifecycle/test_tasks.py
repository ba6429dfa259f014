"""The controller's TaskGroup: a pause ends the acts, a lost lease ends the restoring work
too (decision 0295)."""

from __future__ import annotations

import asyncio

import pytest

from gpufleet.lifecycle.tasks import TaskGroup


async def _spawned() -> tuple[TaskGroup, dict[str, asyncio.Task[None]]]:
    group = TaskGroup()
    tasks = {
        kind: group.spawn(
            asyncio.sleep(60), kind, acting=kind == "act", restoring=kind == "restore"
        )
        for kind in ("act", "restore", "plain")
    }
    await asyncio.sleep(0)
    return group, tasks


@pytest.mark.parametrize(
    ("stop", "stopped", "cancelled"),
    [
        ("stop_acting", 1, {"act": True, "restore": False, "plain": False}),
        ("stop_leading", 2, {"act": True, "restore": True, "plain": False}),
    ],
    ids=["a-pause-leaves-the-restoring-work", "a-lost-lease-ends-it-too"],
)
def test_what_each_stop_cancels(stop: str, stopped: int, cancelled: dict[str, bool]) -> None:
    async def main() -> tuple[int, dict[str, bool]]:
        group, tasks = await _spawned()
        count = getattr(group, stop)("why")
        await asyncio.sleep(0)
        states = {k: t.cancelled() for k, t in tasks.items()}
        await group.close()
        return count, states

    assert asyncio.run(main()) == (stopped, cancelled)


def test_a_task_is_not_both_acting_and_restoring() -> None:
    async def main() -> None:
        coro = asyncio.sleep(0)
        try:
            TaskGroup().spawn(coro, "both", acting=True, restoring=True)
        finally:
            coro.close()

    with pytest.raises(ValueError, match="acting or restoring"):
        asyncio.run(main())
