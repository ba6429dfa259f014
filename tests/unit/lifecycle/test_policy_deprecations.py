"""A FleetPolicy written for an earlier version is used, and the controller says which of its
fields are gone and what replaces them: a Warning Event and the condition ``Deprecated``."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api import conditions
from gpufleet.api import fleetpolicy as fp
from gpufleet.clock import ManualClock
from gpufleet.domain.policy import default_policy
from gpufleet.lifecycle.policy import DEPRECATED

from .fakes import FakeKube, controller
from .test_controller import settle


def test_a_removed_field_is_used_converted_and_said_until_the_spec_drops_it() -> None:
    kube = FakeKube()
    body = kube.custom[(fp.PLURAL, "default")]
    spec = default_policy().model_dump(by_alias=True, mode="json")
    spec["lemon"] = {"incidents": 4, "windowDays": 7}
    body["metadata"].update(generation=1, uid="u")
    body["spec"] = spec
    ctl = controller(kube, clock=ManualClock(1_800_000_000.0))

    def conds() -> list[dict[str, Any]]:
        return list(body.get("status", {}).get("conditions") or [])

    async def go() -> None:
        await ctl.on_policy(body)
        await settle(ctl)
        assert ctl.policies.policy_seen and not ctl.policies.policy.paused
        assert ctl.policies.policy.lemon.threshold == 3.5
        assert ctl.policies.policy.lemon.half_life_days == 14.0
        valid, said = conditions.find(conds(), "Valid"), conditions.find(conds(), DEPRECATED)
        assert valid is not None and valid["status"] == "True"
        assert said is not None and said["status"] == "True" and said["reason"] == "RemovedFields"
        assert (
            "use lemon.threshold" in said["message"] and "use lemon.halfLifeDays" in said["message"]
        )
        (event,) = [e for e in kube.events if e["reason"] == "DeprecatedFields"]
        assert event["type"] == "Warning" and "lemon.incidents was removed" in event["message"]
        # The operator rewrites the policy: the condition turns False, no new Event.
        body["spec"] = {**spec, "lemon": {"threshold": 3.5}}
        body["metadata"]["generation"] = 2
        await ctl.on_policy(body)
        await settle(ctl)
        said = conditions.find(conds(), DEPRECATED)
        assert said is not None and said["status"] == "False"
        assert len([e for e in kube.events if e["reason"] == "DeprecatedFields"]) == 1
        await ctl.close()

    asyncio.run(go())
