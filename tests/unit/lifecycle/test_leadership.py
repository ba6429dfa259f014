"""One acting replica: the Lease is created, renewed and taken over by compare-and-swap only,
a standby waits a whole lease duration on its own clock, and the fence holds with a margin."""

from __future__ import annotations

import asyncio

from gpufleet.clock import ManualClock
from gpufleet.kubeapi import LEASES
from gpufleet.lifecycle.leadership import Leadership
from gpufleet.waits import within

from .fakes import FakeKube


def replica(kube: FakeKube, clock: ManualClock, who: str) -> Leadership:
    return Leadership(
        kube, namespace="gpufleet", name="controller", identity=who, duration_s=30, clock=clock
    )


def lease(kube: FakeKube) -> dict[str, object]:
    return kube.custom[(LEASES.plural, "controller")]["spec"]  # type: ignore[no-any-return]


def test_one_replica_acts_the_other_waits_a_whole_lease_after_the_last_renewal() -> None:
    async def go() -> None:
        kube, clock = FakeKube(), ManualClock(1_000.0)
        a, b = replica(kube, clock, "a"), replica(kube, clock, "b")
        assert await a.attempt() and a.holds(15) and a.epoch == 0
        assert not await b.attempt() and not b.holds(0) and "a holds" in str(b.problem)
        clock.advance(10)
        assert await a.attempt()  # renewed at +10: valid until +40
        clock.advance(1)
        assert not await b.attempt()  # b sees the renewal at +11
        clock.advance(24)  # +35: 24 s since b saw it change
        assert not await b.attempt()
        assert a.holds(0) and not a.holds(15)  # the gate's margin is gone before the lease
        clock.advance(7)  # +42: a stopped renewing; 31 s by b's own clock since it saw it
        assert not a.leading
        assert await b.attempt() and b.epoch == 1 and lease(kube)["holderIdentity"] == "b"
        assert not await a.attempt()  # a comes back: b holds it now

    asyncio.run(go())


def test_two_replicas_writing_at_once_cannot_both_win() -> None:
    async def go() -> None:
        kube, clock = FakeKube(), ManualClock(1_000.0)
        a, b = replica(kube, clock, "a"), replica(kube, clock, "b")
        await a.attempt()
        clock.advance(31)
        await b.attempt()  # b saw it first at +31: not expired for b yet
        clock.advance(31)
        won = await asyncio.gather(b.attempt(), replica(kube, clock, "c").attempt())
        assert won.count(True) <= 1
        holders = [r for r in (a, b) if r.leading]
        assert len(holders) <= 1

    asyncio.run(go())


def test_a_released_lease_is_taken_at_once_and_the_loop_says_who_acts() -> None:
    async def go() -> None:
        kube, clock = FakeKube(), ManualClock(1_000.0)
        a, b = replica(kube, clock, "a"), replica(kube, clock, "b")
        assert await a.attempt()
        await b.attempt()
        await a.release()
        assert await b.attempt() and b.leading
        said: list[str] = []
        stop = asyncio.Event()

        async def lead() -> None:
            said.append("lead")

        def lose(why: str) -> None:
            said.append(f"lose: {why}")

        c = Leadership(
            kube, namespace="gpufleet", name="other", identity="c", renew_s=0.01, retry_s=0.01
        )
        task = asyncio.create_task(c.run(lead, lose, stopped=stop.is_set))
        await asyncio.sleep(0.05)
        stop.set()
        await within(5, task)
        assert said[0] == "lead" and said[-1].startswith("lose")
        assert kube.custom[(LEASES.plural, "other")]["spec"].get("holderIdentity") is None

    asyncio.run(go())


def test_lease_reads_and_writes_go_before_ordinary_requests() -> None:
    """Decision 0292: a renewal queued behind a storm's drains and steps came too late and
    the Lease was lost; its requests are made urgent."""
    from typing import Any

    from gpufleet.kubeapi.slots import is_urgent

    class Noting(FakeKube):
        def __init__(self) -> None:
            super().__init__()
            self.urgent: list[tuple[str, bool]] = []

        async def get(self, resource: Any, name: str, **kw: Any) -> Any:
            self.urgent.append(("get", is_urgent()))
            return await super().get(resource, name, **kw)

        async def create(self, resource: Any, body: Any, **kw: Any) -> Any:
            self.urgent.append(("create", is_urgent()))
            return await super().create(resource, body, **kw)

        async def patch(self, resource: Any, name: str, patch: Any, **kw: Any) -> Any:
            self.urgent.append(("patch", is_urgent()))
            return await super().patch(resource, name, patch, **kw)

    async def go() -> None:
        kube, clock = Noting(), ManualClock(1_000.0)
        a = replica(kube, clock, "a")
        assert await a.attempt()  # created
        clock.advance(5)
        assert await a.attempt()  # renewed
        assert [verb for verb, _ in kube.urgent] == ["get", "create", "get", "patch"]
        assert all(hurry for _, hurry in kube.urgent)
        assert not is_urgent()  # only inside the attempt

    asyncio.run(go())
