"""The controller counts each node's NVLink domain as records change (read from the Node's
labels as soon as a FleetPolicy with ``safety.budget.perDomain`` arrives), and the
FleetPolicy status lists the domains at their budget (``domainBudget``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from gpufleet.api import fleetpolicy as fp
from gpufleet.clock import ManualClock
from gpufleet.domain.policy import default_policy
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle.controller import ControllerSettings

from .fakes import FakeKube, controller

DOMAIN = "network.topology.nvidia.com/accelerator"


def test_the_domains_at_their_budget_are_in_the_status() -> None:
    kube = FakeKube()
    body = kube.custom[(fp.PLURAL, "default")]
    body["metadata"].update(generation=1, uid="u")
    spec: dict[str, Any] = default_policy().model_dump(by_alias=True, mode="json")
    spec["safety"]["budget"].update(maxNodes=10, maxPercent=100, perDomain={"maxNodes": 1})
    body["spec"] = spec
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=ManualClock(1e9))
    domains = {"a0": "nvl-a", "a1": "nvl-a", "b0": "nvl-b", "b1": "nvl-b", "x": None}
    for name, domain in domains.items():
        labels = {DOMAIN: domain} if domain else {}
        ctl.nodes.book.put(name, {"metadata": {"name": name, "labels": labels}})
        state = NodeState.DRAINING if name in ("a0", "x") else NodeState.PRODUCTION
        ctl.fleet.put(NodeRecord.new(name, at=0, state=state, pool="p"))

    async def go() -> dict[str, Any]:
        await ctl.on_policy(body)
        await ctl.save_fleet_status()
        return dict(kube.custom[(fp.PLURAL, "default")]["status"]["domainBudget"])

    # nvl-a is at its limit, nvl-b is not; the node of no domain is in none.
    assert asyncio.run(go()) == {
        "nvl-a": {"size": 2, "outOfService": 1, "allowed": 1, "waiting": 0}
    }
    assert ctl.fleet.records["b1"].nvlink_domain == "nvl-b"
    assert ctl.fleet.records["x"].nvlink_domain == ""
    view = ctl.fleet.view()
    assert view.domain("nvl-a").out_of_service == 1 and view.domain("nvl-b").size == 2
    # The count follows a record's change without a rebuild.
    ctl.fleet.put(replace(ctl.fleet.records["b1"], state=NodeState.REMEDIATING))
    assert ctl.fleet.view().domain("nvl-b").out_of_service == 1
