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


def test_a_pause_cancels_the_acts_and_leaves_the_restoring_work() -> None:
    async def main() -> tuple[int, dict[str, bool]]:
        group, tasks = await _spawned()
        stopped = group.stop_acting("the policy is paused")
        await asyncio.sleep(0)
        states = {k: t.cancelled() for k, t in tasks.items()}
        await group.close()
        return stopped, states

    assert asyncio.run(main()) == (1, {"act": True, "restore": False, "plain": False})


def test_a_lost_lease_cancels_the_acts_and_the_restoring_work() -> None:
    async def main() -> tuple[int, dict[str, bool]]:
        group, tasks = await _spawned()
        stopped = group.stop_leading("the lease was lost")
        await asyncio.sleep(0)
        states = {k: t.cancelled() for k, t in tasks.items()}
        await group.close()
        return stopped, states

    assert asyncio.run(main()) == (2, {"act": True, "restore": True, "plain": False})


def test_a_task_is_not_both_acting_and_restoring() -> None:
    async def main() -> None:
        coro = asyncio.sleep(0)
        try:
            TaskGroup().spawn(coro, "both", acting=True, restoring=True)
        finally:
            coro.close()

    with pytest.raises(ValueError, match="acting or restoring"):
        asyncio.run(main())
