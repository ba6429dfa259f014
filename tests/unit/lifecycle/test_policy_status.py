"""The FleetPolicy's status conditions follow metav1.Condition: a breaker save keeps
``Valid`` (and the other way round), lastTransitionTime moves only on a change, and each
condition says which generation it was computed from."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from gpufleet.api import conditions
from gpufleet.api import fleetpolicy as fp
from gpufleet.clock import ManualClock
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.faults import FaultEvent, FaultKind
from gpufleet.domain.policy import default_policy
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle.controller import ControllerSettings

from .fakes import FakeKube, controller


def _kube(generation: int) -> FakeKube:
    kube = FakeKube()
    body = kube.custom[(fp.PLURAL, "default")]
    body["metadata"].update(generation=generation, uid="u")
    body["spec"] = default_policy().model_dump(by_alias=True, mode="json")
    return kube


def _conds(kube: FakeKube) -> list[dict[str, Any]]:
    return list(kube.custom[(fp.PLURAL, "default")].get("status", {}).get("conditions") or [])


def test_valid_survives_a_breaker_save_and_times_move_only_on_change() -> None:
    kube = _kube(generation=3)
    clock = ManualClock(1_800_000_000.0)
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=clock)

    async def go() -> None:
        await ctl.on_policy(kube.custom[(fp.PLURAL, "default")])
        clock.advance(10)
        await ctl.save_fleet_status()
        clock.advance(10)
        await ctl.save_fleet_status()  # nothing changed: no transition

    asyncio.run(go())
    conds = _conds(kube)
    valid = conditions.find(conds, "Valid")
    breaker = conditions.find(conds, "BreakerOpen")
    assert valid is not None and valid["status"] == "True"  # not wiped by the breaker save
    assert valid["observedGeneration"] == 3
    assert breaker is not None and breaker["status"] == "False"
    assert breaker["lastTransitionTime"] == rfc3339(1_800_000_010.0)
    assert breaker["observedGeneration"] == 3


def test_a_restarted_controller_keeps_the_transition_times_it_finds() -> None:
    kube = _kube(generation=1)
    body = kube.custom[(fp.PLURAL, "default")]
    body["status"] = {
        "conditions": [
            conditions.condition("Valid", "True", "Valid", "the policy is in use", since=5.0),
            conditions.condition("BreakerOpen", "False", "Closed", "0", since=6.0),
        ]
    }
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=ManualClock(1e9))

    async def go() -> None:
        await ctl.on_policy(body)
        await ctl.save_fleet_status()

    asyncio.run(go())
    conds = {c["type"]: c for c in _conds(kube)}
    assert conds["Valid"]["lastTransitionTime"] == rfc3339(5.0)
    assert conds["BreakerOpen"]["lastTransitionTime"] == rfc3339(6.0)


def test_nodes_waiting_for_the_rails_are_counted_per_pool_and_rail() -> None:
    """A withheld fault is shown on the FleetPolicy (decision 0126): per pool in
    ``budget.<pool>.waiting``, per rail in the ``FaultsWaiting`` condition, and gone
    from both once the node is acted on."""
    kube = _kube(generation=1)
    ctl = controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=ManualClock(1e9))
    held = FaultEvent(FaultKind.XID, "a", at=1.0, xid=79)
    for name, pool in (("a", "gpu"), ("b", "gpu"), ("c", "cpu"), ("d", "gpu")):
        ctl.fleet.put(NodeRecord.new(name, at=0, state=NodeState.PRODUCTION, pool=pool))
    for name in ("a", "b", "c"):
        ctl.fleet.put(replace(ctl.fleet.records[name], pending=held))
    ctl.policies.holds.say("a", "budget-exhausted: cordon")
    ctl.policies.holds.say("b", "breaker-open: cordon")

    async def go() -> dict[str, Any]:
        await ctl.on_policy(kube.custom[(fp.PLURAL, "default")])
        await ctl.save_fleet_status()
        return dict(kube.custom[(fp.PLURAL, "default")]["status"])

    status = asyncio.run(go())
    assert status["budget"]["gpu"]["waiting"] == 2 and status["budget"]["cpu"]["waiting"] == 1
    waiting = conditions.find(status["conditions"], "FaultsWaiting")
    assert waiting is not None and waiting["status"] == "True"
    assert "3 node(s) wait" in waiting["message"]
    assert "breaker-open 1, budget-exhausted 1, to be decided again 1" in waiting["message"]

    for name in ("a", "b", "c"):
        ctl.fleet.put(replace(ctl.fleet.records[name], pending=None))
    asyncio.run(ctl.save_fleet_status())
    status = kube.custom[(fp.PLURAL, "default")]["status"]
    assert status["budget"]["gpu"]["waiting"] == 0
    waiting = conditions.find(status["conditions"], "FaultsWaiting")
    assert waiting is not None and waiting["status"] == "False"
