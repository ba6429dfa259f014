"""gpufleet_actions_total says what happened to each action, not "ok" for all of them."""

from __future__ import annotations

import asyncio

from gpufleet.clock import ManualClock
from gpufleet.domain import conditions, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.lifecycle.controller import Controller, ControllerSettings

from .fakes import FakeKube, controller, k8s_policy, node, set_condition


def _answer(kube: FakeKube, name: str) -> None:
    request = conditions.decode_request(
        kube.nodes[name]["metadata"]["annotations"][well_known.ANNOTATION_AGENT_REQUEST]
    )
    assert request is not None
    # An agent not upgraded yet answers in the former GpufleetRequest condition: still read.
    set_condition(kube.nodes[name], conditions.AgentResult(request.id, True, "ok").condition())


async def _repair_once(admin_cordon: bool) -> Controller:
    """XID 48 on n1 (GPU reset asked of the agent), verified, back in production."""
    kube = FakeKube()
    for i in range(4):
        kube.add_node(node(f"n{i}", unschedulable=admin_cordon and i == 1))
    clock = ManualClock()
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=clock)
    ctl.policies.use(k8s_policy())
    await ctl.prime()
    for body in list(kube.nodes.values()):
        await ctl.on_node(body)
    fault = FaultEvent(FaultKind.XID, "n1", at=clock.now(), xid=48, evidence=Evidence(gpu_index=2))
    set_condition(kube.nodes["n1"], conditions.problem(Subsystem.GPU, [fault]))
    await ctl.on_node(kube.nodes["n1"])
    async with asyncio.timeout(30):  # the drain runs in the background
        while ctl.tasks.pending:
            await asyncio.wait(set(ctl.tasks.pending))
    for _ in ("gpu-reset", "verify"):
        _answer(kube, "n1")
        await ctl.on_node(kube.nodes["n1"])
    assert kube.nodes["n1"]["spec"].get("unschedulable") is (True if admin_cordon else None)
    await ctl.close()
    return ctl


def _count(ctl: Controller, result: str) -> float:
    value = ctl.metrics.registry.get_sample_value(
        "gpufleet_actions_total", {"action": "uncordon", "result": result}
    )
    return value or 0.0


def test_an_uncordon_that_leaves_someone_elses_cordon_is_counted_as_kept() -> None:
    ctl = asyncio.run(_repair_once(admin_cordon=True))
    assert (_count(ctl, "kept"), _count(ctl, "ok")) == (1.0, 0.0)


def test_an_uncordon_that_clears_our_cordon_is_counted_as_ok() -> None:
    ctl = asyncio.run(_repair_once(admin_cordon=False))
    assert (_count(ctl, "kept"), _count(ctl, "ok")) == (0.0, 1.0)
