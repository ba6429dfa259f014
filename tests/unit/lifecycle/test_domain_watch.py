"""The controller judges fabric faults with their NVLink domain (decision 0240) on the
in-memory API: a switch fault on some trays of one domain holds every tray of it (none
starts a ladder step), the other domain is untouched, one Event on the FleetPolicy says so,
``status.domainFaults`` lists it; once no tray reports, each held tray is verified."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api import fleetpolicy as fp
from gpufleet.clock import ManualClock
from gpufleet.domain import conditions, domain_faults, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.records import record_from_json
from gpufleet.lifecycle.controller import Controller, ControllerSettings

from .fakes import FakeKube, controller, k8s_policy, node, set_condition

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


def test_a_switch_fault_holds_its_domain_and_its_repair_verifies_each_tray() -> None:
    async def go() -> None:
        kube = FakeKube()
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
