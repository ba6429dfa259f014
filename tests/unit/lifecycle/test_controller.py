"""The controller's passes against an in-memory API: ownership, record-before-act, rails."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufleet.clock import ManualClock
from gpufleet.domain import conditions, node_reports, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.records import record_from_json
from gpufleet.lifecycle import nodes
from gpufleet.lifecycle.controller import Controller, ControllerSettings

from .fakes import KEY, FakeKube, controller, k8s_policy, node, set_annotation, set_condition


def xid79(name: str, at: float) -> FaultEvent:
    return FaultEvent(FaultKind.XID, name, at=at, xid=79, evidence=Evidence(gpu_index=3))


async def make(
    n: int = 10, *, kube: FakeKube | None = None, **policy: Any
) -> tuple[FakeKube, Controller, ManualClock]:
    kube = kube or FakeKube()
    for i in range(n):
        kube.add_node(node(f"n{i}"))
    clock = ManualClock()
    # No coalescing delay for the status save: settle() would wait it out.
    settings = ControllerSettings(status_save_delay_s=0.0)
    ctl = controller(kube, settings, clock=clock)
    ctl.policies.use(k8s_policy().model_copy(update=policy))
    await ctl.prime()
    for body in list(kube.nodes.values()):
        await ctl.on_node(body)
    return kube, ctl, clock


async def settle(ctl: Controller) -> None:
    """Wait until the work the controller started in the background (drains, BMC steps,
    Events, NodeRemediation writes, the status save) has finished, tasks that work
    started included: what is asserted next has happened, however slow the machine."""
    async with asyncio.timeout(30):  # a task that never ends fails the test, not hangs it
        while ctl.tasks.pending:
            await asyncio.wait(set(ctl.tasks.pending))


async def fault(kube: FakeKube, ctl: Controller, name: str, at: float) -> None:
    body = kube.nodes[name]
    set_condition(body, conditions.problem(Subsystem.PCIE, [xid79(name, at)]))
    await ctl.on_node(body)


def record(kube: FakeKube, name: str) -> Any:
    return record_from_json(
        kube.nodes[name]["metadata"]["annotations"][well_known.ANNOTATION_RECORD]
    )


def test_fault_cordons_taints_and_drains_in_one_write() -> None:
    async def go() -> None:
        kube, ctl, clock = await make()
        before = kube.patches
        await fault(kube, ctl, "n1", clock.now())
        n1 = kube.nodes["n1"]
        assert kube.patches == before + 1
        assert n1["spec"]["unschedulable"] is True
        assert (
            n1["metadata"]["annotations"][well_known.ANNOTATION_CORDONED] == well_known.CONTROLLER
        )
        assert {"key": well_known.TAINT_UNHEALTHY, "value": "xid-79", "effect": "NoExecute"} in n1[
            "spec"
        ]["taints"]
        assert n1["metadata"]["labels"][well_known.LABEL_STATE] == "draining"
        await settle(ctl)  # drain task: no pods -> DrainCompleted -> reboot (fails: no BMC)
        assert record(kube, "n1").state.value == "triage"
        await ctl.close()

    asyncio.run(go())


def test_same_condition_again_is_not_a_new_fault() -> None:
    async def go() -> None:
        kube, ctl, clock = await make()
        await fault(kube, ctl, "n1", clock.now())
        r1 = record(kube, "n1")
        await ctl.on_node(kube.nodes["n1"])
        assert record(kube, "n1").occurrences == r1.occurrences
        await ctl.close()

    asyncio.run(go())


def test_someone_elses_cordon_and_taints_are_never_cleared() -> None:
    kube_body = node("n1", unschedulable=True)
    kube_body["spec"]["taints"] = [{"key": "admin/hold", "effect": "NoSchedule"}]
    from gpufleet.domain.actions import Action, ActionKind
    from gpufleet.domain.records import NodeRecord

    rec = NodeRecord.new("n1", at=0, state=nodes.NodeState.PRODUCTION)
    patch = nodes.node_patch(
        kube_body, rec, (Action(ActionKind.UNTAINT), Action(ActionKind.UNCORDON)), key=KEY
    )
    assert "spec" not in patch  # no cordon change, admin taint kept


def test_our_cordon_is_cleared_and_only_our_taints_removed() -> None:
    body = node("n1", unschedulable=True)
    body["metadata"]["annotations"][well_known.ANNOTATION_CORDONED] = well_known.CONTROLLER
    body["spec"]["taints"] = [
        {"key": "admin/hold", "effect": "NoSchedule"},
        {"key": well_known.TAINT_UNHEALTHY, "effect": "NoExecute"},
        {"key": well_known.TAINT_UNVERIFIED, "effect": "NoSchedule"},
    ]
    from gpufleet.domain.actions import Action, ActionKind
    from gpufleet.domain.records import NodeRecord

    rec = NodeRecord.new("n1", at=0, state=nodes.NodeState.PRODUCTION)
    patch = nodes.node_patch(
        body, rec, (Action(ActionKind.UNTAINT), Action(ActionKind.UNCORDON)), key=KEY
    )
    after = nodes.apply_merge_patch(body, patch)
    assert "unschedulable" not in after["spec"]
    assert after["spec"]["taints"] == [{"key": "admin/hold", "effect": "NoSchedule"}]
    assert well_known.ANNOTATION_CORDONED not in after["metadata"]["annotations"]


def test_concurrent_faults_never_exceed_the_budget() -> None:
    async def go() -> None:
        kube, ctl, clock = await make(20)  # budget: 10% of 20 = 2
        safety = ctl.policies.policy.safety
        breaker = safety.breaker.model_copy(update={"min_nodes": 50})
        ctl.policies.use(
            ctl.policies.policy.model_copy(
                update={"safety": safety.model_copy(update={"breaker": breaker})}
            )
        )
        for i in range(6):
            set_condition(
                kube.nodes[f"n{i}"],
                conditions.problem(Subsystem.PCIE, [xid79(f"n{i}", clock.now())]),
            )
        await asyncio.gather(*(ctl.on_node(kube.nodes[f"n{i}"]) for i in range(6)))
        out = [n for n in kube.nodes.values() if n["spec"].get("unschedulable")]
        assert len(out) == 2
        held = [e for e in kube.events if e["reason"] == "ActionWithheld"]
        assert len(held) == 4 and "budget-exhausted" in held[0]["message"]
        await ctl.close()

    asyncio.run(go())


def test_breaker_trips_and_holds_further_isolation() -> None:
    async def go() -> None:
        kube, ctl, clock = await make(20)  # breaker: max(2, 10% of 20) = 2 tolerated
        for i in range(4):
            await fault(kube, ctl, f"n{i}", clock.now())
        assert ctl.fleet.breaker.is_open
        assert ctl.metrics.breaker_open._value.get() == 1  # type: ignore[attr-defined]
        out = [n for n in kube.nodes.values() if n["spec"].get("unschedulable")]
        assert len(out) == 2
        await ctl.close()

    asyncio.run(go())


@pytest.mark.parametrize("flag", ["paused", "dry_run"])
def test_pause_and_dry_run_change_nothing(flag: str) -> None:
    async def go() -> None:
        kube, ctl, clock = await make(10, **{flag: True})
        await fault(kube, ctl, "n1", clock.now())
        assert not kube.nodes["n1"]["spec"].get("unschedulable")
        assert record(kube, "n1").state.value == "production"
        await settle(ctl)  # Events are posted in the background
        assert any(e["reason"] == "ActionWithheld" for e in kube.events)
        await ctl.close()

    asyncio.run(go())


def answer(kube: FakeKube, name: str, passed: bool) -> None:
    request = conditions.decode_request(
        kube.nodes[name]["metadata"]["annotations"][well_known.ANNOTATION_AGENT_REQUEST]
    )
    assert request is not None
    result = conditions.AgentResult(request.id, passed, "ok")
    set_annotation(kube.nodes[name], node_reports.result(result))


def test_gpu_reset_and_verification_return_the_node_and_clear_only_our_marks() -> None:
    async def go() -> None:
        kube, ctl, clock = await make(10)
        kube.nodes["n1"]["spec"]["taints"] = [{"key": "admin/hold", "effect": "NoSchedule"}]
        fault48 = FaultEvent(
            FaultKind.XID, "n1", at=clock.now(), xid=48, evidence=Evidence(gpu_index=2)
        )
        set_condition(kube.nodes["n1"], conditions.problem(Subsystem.GPU, [fault48]))
        await ctl.on_node(kube.nodes["n1"])
        await settle(ctl)  # no pods: drained -> gpu-reset asked of the agent
        req = conditions.decode_request(
            kube.nodes["n1"]["metadata"]["annotations"][well_known.ANNOTATION_AGENT_REQUEST]
        )
        assert req is not None and req.kind == "gpu-reset" and req.gpu_index == 2
        assert record(kube, "n1").state.value == "remediating"
        answer(kube, "n1", True)
        await ctl.on_node(kube.nodes["n1"])
        assert record(kube, "n1").state.value == "verifying"
        taints = {t["key"] for t in kube.nodes["n1"]["spec"]["taints"]}
        assert taints == {"admin/hold", well_known.TAINT_UNHEALTHY, well_known.TAINT_UNVERIFIED}
        answer(kube, "n1", True)
        await ctl.on_node(kube.nodes["n1"])
        n1 = kube.nodes["n1"]
        assert record(kube, "n1").state.value == "production"
        assert n1["spec"]["taints"] == [{"key": "admin/hold", "effect": "NoSchedule"}]
        assert not n1["spec"].get("unschedulable")
        await settle(ctl)  # the NodeRemediation status is written in the background
        (nrem,) = [v for (plural, _), v in kube.custom.items() if plural == "noderemediations"]
        assert nrem["status"]["outcome"] == "repaired"
        assert [s["step"] for s in nrem["status"]["steps"]] == ["gpu-reset"]
        await ctl.close()

    asyncio.run(go())


def test_failed_bmc_steps_escalate_to_triage() -> None:
    async def go() -> None:
        kube, ctl, clock = await make(10)
        # XID 79: reboot; no BMC Secret -> every step fails
        await fault(kube, ctl, "n1", clock.now())
        await settle(ctl)  # drain, then one BMC step after the other, each failing
        r = record(kube, "n1")
        assert r.state.value == "triage"
        assert [(a.step.value, a.outcome.value) for a in r.incident.tried] == [
            ("reboot", "failed"),
            ("power-cycle", "failed"),
            ("reimage", "failed"),
        ]
        assert "bmc-secret" in r.incident.tried[0].detail
        await ctl.close()

    asyncio.run(go())
