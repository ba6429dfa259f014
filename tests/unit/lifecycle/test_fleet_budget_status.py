"""The FleetPolicy status shows the fleet-wide budget beside the pools' (``fleetBudget``), and
a new fleet limit alone is saved (no pool's use changed)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api import fleetpolicy as fp
from gpufleet.clock import ManualClock
from gpufleet.domain.policy import default_policy
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle.controller import ControllerSettings

from .fakes import FakeKube, controller


def _spec(**budget: Any) -> dict[str, Any]:
    spec: dict[str, Any] = default_policy().model_dump(by_alias=True, mode="json")
    spec["safety"]["budget"].update(budget)
    return spec


def test_fleet_budget_in_the_status_follows_the_pools_and_the_policy() -> None:
    kube = FakeKube()
    body = kube.custom[(fp.PLURAL, "default")]
    body["metadata"].update(generation=1, uid="u")
    body["spec"] = _spec(fleetMaxNodes=3)
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=ManualClock(1e9))
    states = {"a0": NodeState.DRAINING, "b0": NodeState.VERIFYING}
    states.update({f"a{i}": NodeState.PRODUCTION for i in range(1, 9)})
    for name, state in states.items():
        ctl.fleet.put(NodeRecord.new(name, at=0, state=state, pool=name[0]))

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        await ctl.on_policy(body)
        await ctl.save_fleet_status()
        first = dict(kube.custom[(fp.PLURAL, "default")]["status"]["fleetBudget"])
        # Only the fleet limit changes: no pool's use moves, the status must follow anyway.
        body["metadata"]["generation"] = 2
        body["spec"] = _spec(fleetMaxNodes=5)
        await ctl.on_policy(body)
        for _ in range(50):  # the coalescing saver runs on the loop
            await asyncio.sleep(0.01)
            if kube.custom[(fp.PLURAL, "default")]["status"]["fleetBudget"]["allowed"] == 5:
                break
        return first, dict(kube.custom[(fp.PLURAL, "default")]["status"]["fleetBudget"])

    first, second = asyncio.run(go())
    assert first == {"size": 10, "outOfService": 2, "allowed": 3, "waiting": 0}
    assert second["allowed"] == 5 and second["outOfService"] == 2


def test_without_a_fleet_limit_the_status_says_none() -> None:
    kube = FakeKube()
    body = kube.custom[(fp.PLURAL, "default")]
    body["metadata"].update(generation=1, uid="u")
    body["spec"] = _spec()
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=ManualClock(1e9))
    ctl.fleet.put(NodeRecord.new("n", at=0, state=NodeState.PRODUCTION, pool="p"))

    async def go() -> dict[str, Any]:
        await ctl.on_policy(body)
        await ctl.save_fleet_status()
        return dict(kube.custom[(fp.PLURAL, "default")]["status"]["fleetBudget"])

    # A merge patch's null removes the key: no ``allowed`` means no fleet-wide limit.
    assert asyncio.run(go()) == {"size": 1, "outOfService": 0, "waiting": 0}


def test_a_group_budget_in_the_status_counts_the_groups_nodes_once_the_policy_names_it() -> None:
    """Nodes already held when a FleetPolicy with an override arrives are grouped at once
    (by their labels), and ``status.groupBudget`` counts them across pools."""
    kube = FakeKube()
    body = kube.custom[(fp.PLURAL, "default")]
    body["metadata"].update(generation=1, uid="u")
    body["spec"] = _spec(maxNodes=10, maxPercent=100)
    body["spec"]["overrides"] = [
        {
            "name": "rack-a",
            "nodeSelector": {"matchLabels": {"example.com/rack": "a"}},
            "budget": {"maxNodes": 1},
        }
    ]
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=ManualClock(1e9))
    racks = {"n1": "a", "n2": "a", "n3": "a", "n4": "b"}
    for name, rack in racks.items():
        node = {"metadata": {"name": name, "labels": {"example.com/rack": rack}}}
        ctl.nodes.book.put(name, node)
        state = NodeState.DRAINING if name == "n1" else NodeState.PRODUCTION
        ctl.fleet.put(NodeRecord.new(name, at=0, state=state, pool=f"p{name[-1]}"))

    async def go() -> dict[str, Any]:
        await ctl.on_policy(body)
        await ctl.save_fleet_status()
        return dict(kube.custom[(fp.PLURAL, "default")]["status"]["groupBudget"])

    assert asyncio.run(go()) == {
        "rack-a": {"size": 3, "outOfService": 1, "allowed": 1, "waiting": 0}
    }
    assert ctl.fleet.records["n2"].group == "rack-a" and ctl.fleet.records["n4"].group == ""
