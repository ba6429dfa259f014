"""The ticket work of the controller against an in-memory API, where no webhook is called:
dry-run says once what it would send and writes nothing; pause holds everything; without a
webhook nothing happens at all. (Calls, retries and restarts are tested on the real cluster:
tests/integration/test_rma_ticket.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.clock import ManualClock
from gpufleet.domain import events as ev
from gpufleet.domain import rma, well_known
from gpufleet.lifecycle import tickets
from gpufleet.lifecycle.controller import Controller, ControllerSettings

from .fakes import FakeKube, controller, k8s_policy, node

WEBHOOK = "http://127.0.0.1:9/never-called"


async def _in_triage(settings: ControllerSettings, **policy: Any) -> tuple[FakeKube, Controller]:
    """n0 taken to triage by a controller without tickets; then the controller of the test
    (webhook set, the policy given) starts on the same objects, as after a restart."""
    kube = FakeKube()
    for i in range(4):
        kube.add_node(node(f"n{i}"))
    first = controller(kube, ControllerSettings(), clock=ManualClock())
    first.policies.use(k8s_policy())
    await first.prime()
    for body in list(kube.nodes.values()):
        await first.on_node(body)
    await first.feed("n0", ev.OperatorTriage("NCCL hangs"))
    await first.feed("n0", ev.DrainCompleted())
    await _settle(first)
    assert first.fleet.records["n0"].state.value == "triage"
    await first.close()
    ctl = controller(kube, settings, clock=ManualClock())
    ctl.policies.use(k8s_policy().model_copy(update=policy))
    await ctl.prime()
    return kube, ctl


async def _settle(ctl: Controller) -> None:
    async with asyncio.timeout(30):
        while ctl.tasks.pending:
            await asyncio.wait(set(ctl.tasks.pending))


def _ticket_events(kube: FakeKube) -> list[dict[str, Any]]:
    return [e for e in kube.events if str(e.get("reason", "")).startswith("Ticket")]


def test_dry_run_says_once_what_it_would_open_and_writes_nothing() -> None:
    async def go() -> None:
        kube, ctl = await _in_triage(ControllerSettings(ticket_webhook=WEBHOOK), dry_run=True)
        for _ in range(5):
            await ctl.tick_all()
            await _settle(ctl)
        annotations = kube.nodes["n0"]["metadata"]["annotations"]
        assert well_known.ANNOTATION_RMA_TICKET not in annotations
        said = _ticket_events(kube)
        assert [e["reason"] for e in said] == ["TicketWouldOpen"]
        assert "n0/operator/" in said[0]["message"] and "nothing sent" in said[0]["message"]
        assert "n0" not in ctl.tickets._ticketing

    asyncio.run(go())


def test_pause_holds_the_ticket_and_nothing_is_written() -> None:
    async def go() -> None:
        kube, ctl = await _in_triage(ControllerSettings(ticket_webhook=WEBHOOK), paused=True)
        for _ in range(3):
            await ctl.tick_all()
            await _settle(ctl)
        annotations = kube.nodes["n0"]["metadata"]["annotations"]
        assert well_known.ANNOTATION_RMA_TICKET not in annotations
        assert _ticket_events(kube) == []

    asyncio.run(go())


def test_without_a_webhook_there_is_no_ticket() -> None:
    async def go() -> None:
        kube, ctl = await _in_triage(ControllerSettings())
        await ctl.tick_all()
        await _settle(ctl)
        annotations = kube.nodes["n0"]["metadata"]["annotations"]
        assert well_known.ANNOTATION_RMA_TICKET not in annotations
        assert _ticket_events(kube) == []

    asyncio.run(go())


def test_many_nodes_in_triage_get_their_tickets_a_few_at_a_time() -> None:
    async def go() -> None:
        kube = FakeKube()
        for i in range(8):
            kube.add_node(node(f"n{i}"))
        first = controller(kube, ControllerSettings(), clock=ManualClock())
        first.policies.use(
            k8s_policy().model_copy(
                update={"safety": k8s_policy().safety.model_copy(update={"budget": _no_limit()})}
            )
        )
        await first.prime()
        for body in list(kube.nodes.values()):
            await first.on_node(body)
        for i in range(6):
            await first.feed(f"n{i}", ev.OperatorTriage("bad batch of GPUs"))
            await first.feed(f"n{i}", ev.DrainCompleted())
        await _settle(first)
        await first.close()
        assert sum(r.state.value == "triage" for r in first.fleet.records.values()) == 6

        ctl = controller(kube, ControllerSettings(ticket_webhook=WEBHOOK), clock=ManualClock())
        ctl.policies.use(k8s_policy())
        await ctl.prime()
        release = asyncio.Event()
        started: list[str] = []

        async def held(name: str) -> None:  # the call itself is not what this test is about
            started.append(name)
            await release.wait()
            key = rma.ticket_key(ctl.fleet.records[name])
            assert key is not None
            opened = rma.Ticket(key=key, state=rma.TicketState.OPEN, reported="triage")
            annotations = ctl.book.get(name)["metadata"]["annotations"]
            annotations[well_known.ANNOTATION_RMA_TICKET] = rma.encode_ticket(opened)

        ctl.tickets._ticket_work = held  # type: ignore[method-assign]
        await ctl.tick_all()
        await asyncio.sleep(0)
        assert len(started) == tickets.MAX_IN_FLIGHT
        await ctl.tick_all()  # still busy: nobody else starts
        await asyncio.sleep(0)
        assert len(started) == tickets.MAX_IN_FLIGHT
        release.set()
        await _settle(ctl)
        await ctl.tick_all()
        await asyncio.sleep(0)
        await _settle(ctl)
        assert sorted(set(started)) == [f"n{i}" for i in range(6)]

    asyncio.run(go())


def _no_limit() -> Any:
    from gpufleet.domain.policy import Budget

    return Budget(max_nodes=100, max_percent=100, min_nodes=100)
