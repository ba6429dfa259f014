"""The controller's Events go through one recorder: a repeat counts on the first Event."""

from __future__ import annotations

import asyncio

from gpufleet.clock import ManualClock
from gpufleet.lifecycle.controller import ControllerSettings

from .fakes import FakeKube, controller, node
from .test_controller import settle


def test_six_identical_withheld_announcements_are_one_event_counted_six_times() -> None:
    async def go() -> FakeKube:
        kube = FakeKube()
        kube.add_node(node("n0"))
        ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=ManualClock())
        body = kube.nodes["n0"]
        for _ in range(6):
            ctl.events.node(body, "Warning", "ActionWithheld", "budget-exhausted: cordon")
            await settle(ctl)
        ctl.events.node(body, "Warning", "ActionWithheld", "breaker-open: cordon")
        await settle(ctl)
        await ctl.close()
        return kube

    kube = asyncio.run(go())
    held = [e for e in kube.events if e["reason"] == "ActionWithheld"]
    assert [(e["message"], e["count"]) for e in held] == [
        ("budget-exhausted: cordon", 6),
        ("breaker-open: cordon", 1),
    ]
