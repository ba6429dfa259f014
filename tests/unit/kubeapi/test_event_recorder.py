"""Events are aggregated as Kubernetes' recorder does: one object per reason, object and
message, whose count and lastTimestamp grow."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufleet.clock import ManualClock
from gpufleet.kubeapi import Unreachable
from gpufleet.kubeapi.events import EventRecorder, event_body

from ..lifecycle.fakes import FakeKube


def _event(message: str, at: str) -> dict[str, object]:
    return event_body(
        involved={"apiVersion": "v1", "kind": "Node", "name": "gpu-node-0001", "uid": "u1"},
        type_="Warning",
        reason="ActionWithheld",
        message=message,
        component="gpufleet-controller",
        instance="gpufleet-controller",
        namespace="default",
        first=at,
    )


def test_a_repeat_patches_count_and_last_time_of_the_first_event() -> None:
    kube = FakeKube()
    rec = EventRecorder(kube, clock=ManualClock(1_800_000_000.0))

    async def go() -> list[int]:
        counts = []
        for i in range(6):
            counts.append(await rec.record("default", _event("budget: cordon", f"t{i}")))
        counts.append(await rec.record("default", _event("breaker: cordon", "t9")))
        return counts

    assert asyncio.run(go()) == [1, 2, 3, 4, 5, 6, 1]
    first, other = kube.events
    assert first["count"] == 6 and first["lastTimestamp"] == "t5"
    assert first["firstTimestamp"] == "t0"
    assert other["message"] == "breaker: cordon" and other["count"] == 1


def test_an_expired_event_is_created_anew_and_a_restart_starts_new_events() -> None:
    kube = FakeKube()
    rec = EventRecorder(kube, clock=ManualClock(1_800_000_000.0))

    async def go() -> None:
        await rec.record("default", _event("budget: cordon", "t0"))
        await rec.record("default", _event("budget: cordon", "t1"))
        kube.events.clear()  # the apiserver's Event TTL
        assert await rec.record("default", _event("budget: cordon", "t2")) == 1
        restarted = EventRecorder(kube, clock=ManualClock(1_800_000_100.0))
        assert await restarted.record("default", _event("budget: cordon", "t3")) == 1

    asyncio.run(go())
    names = [e["metadata"]["name"] for e in kube.events]
    assert len(names) == 2 and len(set(names)) == 2
    assert all(n.startswith("gpu-node-0001.") for n in names)


class _AnswerLost(FakeKube):
    """The first create goes through and its answer is lost (a timeout, a dropped
    connection): the caller sees an error, the Event exists."""

    lose = True

    async def create_event(self, namespace: str, event: Any) -> None:
        await super().create_event(namespace, event)
        if self.lose:
            self.lose = False
            raise Unreachable("create event", None, "no answer")


def test_an_event_whose_create_answer_was_lost_is_counted_on_from_the_next_try() -> None:
    """The next try of the same Event is refused AlreadyExists (its name carries this
    process's start, so it is ours). It used to fail again on every try: a Notice, which
    its decision's write waits for, held that write back for good (the simulation, seed
    21 of tests/dst/test_runs.py)."""
    kube = _AnswerLost()
    rec = EventRecorder(kube, clock=ManualClock(1_800_000_000.0))

    async def go() -> list[int]:
        with pytest.raises(Unreachable):
            await rec.record("default", _event("held fault let go", "t0"))
        return [await rec.record("default", _event("held fault let go", f"t{i}")) for i in (1, 2)]

    assert asyncio.run(go()) == [1, 2]
    (event,) = kube.events
    assert event["count"] == 2 and event["lastTimestamp"] == "t2"
