"""The FleetPolicy's status conditions follow metav1.Condition: a breaker save keeps
``Valid`` (and the other way round), lastTransitionTime moves only on a change, and each
condition says which generation it was computed from."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api import conditions
from gpufleet.api import fleetpolicy as fp
from gpufleet.clock import ManualClock
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.policy import default_policy
from gpufleet.lifecycle.controller import Controller, ControllerSettings

from .fakes import FakeKube


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
    ctl = Controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=clock)

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
    ctl = Controller(kube, ControllerSettings(status_save_delay_s=0.0), clock=ManualClock(1e9))

    async def go() -> None:
        await ctl.on_policy(body)
        await ctl.save_fleet_status()

    asyncio.run(go())
    conds = {c["type"]: c for c in _conds(kube)}
    assert conds["Valid"]["lastTransitionTime"] == rfc3339(5.0)
    assert conds["BreakerOpen"]["lastTransitionTime"] == rfc3339(6.0)
