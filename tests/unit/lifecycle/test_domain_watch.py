"""The controller judges fabric faults with their NVLink domain (decision 0240) on the
in-memory API: a switch fault on some trays of one domain holds every tray of it (none
starts a ladder step), the other domain is untouched, one Event on the FleetPolicy says so,
``status.domainFaults`` lists it; once no tray reports, each held tray is verified. A held
tray, like a node out for its own fault, gets back the cordon and unhealthy taint gpufleet
set if someone clears them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufleet.api import fleetpolicy as fp
from gpufleet.clock import ManualClock
from gpufleet.domain import conditions, domain_faults, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.policy import DrainMode
from gpufleet.domain.records import record_from_json
from gpufleet.lifecycle.controller import Controller, ControllerSettings

from .fakes import FakeKube, changed, controller, k8s_policy, node, set_condition

LABEL = "network.topology.nvidia.com/accelerator"
TRAYS = {"a0": "nvl-a", "a1": "nvl-a", "a2": "nvl-a", "b0": "nvl-b", "b1": "nvl-b"}


def record(kube: FakeKube, name: str) -> Any:
    return record_from_json(
        kube.nodes[name]["metadata"]["annotations"][well_known.ANNOTATION_RECORD]
    )


async def settle(ctl: Controller) -> None:
    async with asyncio.timeout(30):
        while ctl.tasks.pending:
            await asyncio.wait(set(ctl.tasks.pending))


async def hold_nvl_a(kube: FakeKube) -> tuple[Controller, ManualClock]:
    """A controller that took domain nvl-a out and holds it: a0 and a1 report a switch
    fault, and three ticks past the window have gone by."""
    kube.custom[(fp.PLURAL, "default")]["metadata"].update(generation=1, uid="u")
    for name, domain in TRAYS.items():
        body = node(name)
        body["metadata"]["labels"][LABEL] = domain
        kube.add_node(body)
    clock = ManualClock(1000.0)
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=clock)
    policy = k8s_policy()
    breaker = policy.safety.breaker.model_copy(update={"min_nodes": 20})
    budget = policy.safety.budget.model_copy(update={"max_nodes": 10, "max_percent": 100})
    safety = policy.safety.model_copy(update={"breaker": breaker, "budget": budget})
    ctl.policies.use(policy.model_copy(update={"safety": safety}))  # rails out of the way
    await ctl.prime()
    for body in list(kube.nodes.values()):
        await ctl.on_node(body)
    for name in ("a0", "a1"):
        fault = FaultEvent(
            FaultKind.NVSWITCH_FATAL, name, at=clock.now(),
            evidence=Evidence(switch="nvidia-nvswitch0", message="SXid 24007"),
        )  # fmt: skip
        set_condition(kube.nodes[name], conditions.problem(Subsystem.NVSWITCH, [fault]))
        await ctl.on_node(kube.nodes[name])
    await settle(ctl)
    for _ in range(3):
        clock.advance(200.0)  # past the window: a tray alone would start its ladder now
        await ctl.tick_all()
        await settle(ctl)
    return ctl, clock


def test_a_switch_fault_holds_its_domain_and_its_repair_verifies_each_tray() -> None:
    async def go() -> None:
        kube = FakeKube()
        ctl, _ = await hold_nvl_a(kube)
        for name in ("a0", "a1", "a2"):
            r = record(kube, name)
            assert r.state.value == "draining" and domain_faults.held(r.incident), name
            assert r.incident.tried == () and kube.nodes[name]["spec"].get("unschedulable")
        assert all(record(kube, n).state.value == "production" for n in ("b0", "b1"))
        said = [e for e in kube.events if e.get("reason") == "DomainFaulted"]
        assert len(said) == 1 and "NVLink domain nvl-a" in said[0]["message"]
        await ctl.save_fleet_status()
        status = kube.custom[(fp.PLURAL, "default")]["status"]["domainFaults"]
        assert status["nvl-a"]["held"] == 3 and status["nvl-a"]["reporting"] == ["a0", "a1"]

        for name in ("a0", "a1"):
            set_condition(kube.nodes[name], conditions.healthy(Subsystem.NVSWITCH))
            await ctl.on_node(kube.nodes[name])
        await ctl.tick_all()
        await settle(ctl)
        assert all(record(kube, n).state.value == "verifying" for n in ("a0", "a1", "a2"))
        assert [e for e in kube.events if e.get("reason") == "DomainRepaired"]
        await ctl.tick_all()  # the next pass finds no tray held any more
        await settle(ctl)
        await ctl.save_fleet_status()
        status = kube.custom[(fp.PLURAL, "default")]["status"]["domainFaults"]
        assert status.get("nvl-a") is None

    asyncio.run(go())


FOREIGN = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}
"""Someone else's taint: never touched."""


async def clear_and_pass(kube: FakeKube, ctl: Controller, name: str, what: str) -> None:
    """Clear gpufleet's unhealthy taint (``what`` "taint") or its cordon ("cordon") from
    the Node as a person would (someone else's taint added in the same edit), then run
    the node pass on the watch event (its write lands before it returns)."""
    body = kube.nodes[name]
    spec = body["spec"]
    if what == "taint":
        kept = [t for t in spec.get("taints") or [] if t["key"] != well_known.TAINT_UNHEALTHY]
        spec["taints"] = [*kept, FOREIGN]
    else:
        spec.pop("unschedulable", None)
        spec["taints"] = [*(spec.get("taints") or []), FOREIGN]
    changed(body)
    await ctl.on_node(body)


def unhealthy(kube: FakeKube, name: str) -> list[dict[str, Any]]:
    return [
        t for t in kube.nodes[name]["spec"].get("taints") or []
        if t["key"] == well_known.TAINT_UNHEALTHY
    ]  # fmt: skip


@pytest.mark.parametrize("what", ["taint", "cordon"])
def test_a_held_tray_gets_back_the_taint_or_cordon_someone_cleared(what: str) -> None:
    """A tray held with its domain (an incident without a plan) is out like any other:
    the unhealthy taint and the cordon gpufleet set come back if someone clears them, and
    someone else's taint is left as it is."""

    async def go() -> None:
        kube = FakeKube()
        ctl, _ = await hold_nvl_a(kube)
        assert domain_faults.held(record(kube, "a2").incident)
        assert unhealthy(kube, "a2") == [
            {"key": well_known.TAINT_UNHEALTHY, "value": domain_faults.KEY, "effect": "NoSchedule"}
        ]
        await clear_and_pass(kube, ctl, "a2", what)
        assert domain_faults.held(record(kube, "a2").incident)
        assert kube.nodes["a2"]["spec"].get("unschedulable") is True
        assert unhealthy(kube, "a2") == [
            {"key": well_known.TAINT_UNHEALTHY, "value": domain_faults.KEY, "effect": "NoSchedule"}
        ]
        assert FOREIGN in kube.nodes["a2"]["spec"]["taints"]

    asyncio.run(go())


@pytest.mark.parametrize("what", ["taint", "cordon"])
def test_a_tray_out_for_its_own_fault_gets_back_the_taint_or_cordon_someone_cleared(
    what: str,
) -> None:
    """The same for a node out for a fault of its own (an incident with a plan), beside a
    held domain."""

    async def go() -> None:
        kube = FakeKube()
        ctl, clock = await hold_nvl_a(kube)
        policy = ctl.policies.policy
        drain = policy.drain.model_copy(update={"mode": DrainMode.WAIT})
        ctl.policies.use(policy.model_copy(update={"drain": drain}))
        job = {"metadata": {"name": "train", "namespace": "ns"}, "spec": {"nodeName": "b0"}}
        kube.pods.append({**job, "status": {"phase": "Running"}})  # b0 stays draining
        fault = FaultEvent(
            FaultKind.XID, "b0", at=clock.now(), xid=79, evidence=Evidence(gpu_index=1)
        )
        set_condition(kube.nodes["b0"], conditions.problem(Subsystem.PCIE, [fault]))
        await ctl.on_node(kube.nodes["b0"])
        r = record(kube, "b0")
        assert r.state.value == "draining" and r.incident.plan is not None
        assert unhealthy(kube, "b0")
        await clear_and_pass(kube, ctl, "b0", what)
        assert kube.nodes["b0"]["spec"].get("unschedulable") is True
        assert [t["value"] for t in unhealthy(kube, "b0")] == ["xid-79"]
        assert FOREIGN in kube.nodes["b0"]["spec"]["taints"]
        await ctl.close()  # the drain still waits for the job

    asyncio.run(go())
