"""The controller's hot spare pool against an in-memory API: a spare is promoted the moment
another node of its pool leaves production, in one write that clears its label and taint."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from gpufleet.clock import ManualClock
from gpufleet.domain import conditions, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.policy import Spares
from gpufleet.domain.records import NodeRecord, record_from_json, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle.controller import Controller, ControllerSettings

from .fakes import FakeKube, controller, k8s_policy, node, set_condition


def _spare_node(name: str) -> dict[str, Any]:
    body = node(name)
    rec = replace(NodeRecord.new(name, at=0.0, state=NodeState.PRODUCTION), spare=True)
    body["metadata"]["annotations"][well_known.ANNOTATION_RECORD] = record_to_json(rec)
    body["metadata"]["labels"][well_known.LABEL_SPARE] = "true"
    body["spec"]["taints"] = [
        {"key": well_known.TAINT_SPARE, "value": "true", "effect": "NoSchedule"}
    ]
    return body


async def _make(spare_policy: Spares) -> tuple[FakeKube, Controller, ManualClock]:
    kube = FakeKube()
    for i in range(3):
        kube.add_node(node(f"n{i}"))
    kube.add_node(_spare_node("n3"))
    clock = ManualClock()
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=clock)
    ctl.policies.use(k8s_policy().model_copy(update={"spares": spare_policy}))
    await ctl.prime()
    for body in list(kube.nodes.values()):
        await ctl.on_node(body)
    return kube, ctl, clock


async def _settle(ctl: Controller) -> None:
    async with asyncio.timeout(30):
        while ctl.tasks.pending:
            await asyncio.wait(set(ctl.tasks.pending))


def _record(kube: FakeKube, name: str) -> NodeRecord:
    return record_from_json(
        kube.nodes[name]["metadata"]["annotations"][well_known.ANNOTATION_RECORD]
    )


def test_a_fault_elsewhere_in_the_pool_promotes_the_spare() -> None:
    async def go() -> None:
        kube, ctl, clock = await _make(Spares(percent=0, min_nodes=1))
        await _settle(ctl)
        assert _record(kube, "n3").is_spare  # 3 serve = capacity: nothing to promote
        body = kube.nodes["n1"]
        fault = FaultEvent(
            FaultKind.XID, "n1", at=clock.now(), xid=79, evidence=Evidence(gpu_index=3)
        )
        set_condition(body, conditions.problem(Subsystem.PCIE, [fault]))
        await ctl.on_node(body)
        await _settle(ctl)
        n3 = kube.nodes["n3"]
        assert not _record(kube, "n3").spare and _record(kube, "n3").state is NodeState.PRODUCTION
        assert well_known.LABEL_SPARE not in n3["metadata"]["labels"]
        assert not any(t["key"] == well_known.TAINT_SPARE for t in n3["spec"].get("taints") or [])
        promoted = [e for e in kube.events if e.get("reason") == "SparePromoted"]
        assert [e["involvedObject"]["name"] for e in promoted] == ["n3"]
        await ctl.close()

    asyncio.run(go())


def test_a_paused_policy_keeps_the_spare_in_the_pool() -> None:
    async def go() -> None:
        kube, ctl, _ = await _make(Spares(percent=0, min_nodes=0))  # wants none: promote all
        ctl.policies.use(ctl.policies.policy.model_copy(update={"paused": True}))
        await ctl.tick_all()
        await _settle(ctl)
        assert _record(kube, "n3").is_spare
        assert kube.nodes["n3"]["metadata"]["labels"][well_known.LABEL_SPARE] == "true"
        await ctl.close()

    asyncio.run(go())


def test_a_policy_without_spares_promotes_them_on_the_tick() -> None:
    async def go() -> None:
        kube, ctl, _ = await _make(Spares(percent=0, min_nodes=0))
        await ctl.tick_all()
        await _settle(ctl)
        assert not _record(kube, "n3").spare
        await ctl.close()

    asyncio.run(go())


def test_the_tick_asks_the_pool_again_only_after_records_or_policy_changed(
    monkeypatch: Any,
) -> None:
    from gpufleet.lifecycle import spare_pool

    asked: list[int] = []
    real = spare_pool.spares.promotions

    def counting(records: Any, policy: Any) -> tuple[str, ...]:
        asked.append(1)
        return real(records, policy)

    monkeypatch.setattr(spare_pool.spares, "promotions", counting)

    async def go() -> None:
        kube, ctl, _ = await _make(Spares(percent=0, min_nodes=1))  # the spare stays
        await ctl.tick_all()
        first = len(asked)
        await ctl.tick_all()
        await ctl.tick_all()
        assert len(asked) == first  # nothing changed: the answer (nobody) stands
        body = kube.nodes["n0"]
        fault = FaultEvent(FaultKind.XID, "n0", at=0.0, xid=79, evidence=Evidence(gpu_index=1))
        set_condition(body, conditions.problem(Subsystem.PCIE, [fault]))
        await ctl.on_node(body)
        await _settle(ctl)
        await ctl.tick_all()
        await _settle(ctl)
        assert len(asked) > first
        assert not _record(kube, "n3").spare  # n0 left production: the spare stepped in
        ctl.policies.use(ctl.policies.policy.model_copy())  # a new policy: asked again
        before = len(asked)
        await ctl.tick_all()
        assert len(asked) == before + 1
        await ctl.close()

    asyncio.run(go())
