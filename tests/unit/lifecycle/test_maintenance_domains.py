"""A domain-scope MaintenancePlan in the controller, against an in-memory API (decision
0244): every tray of one NVLink domain drained together, the command asked of each only
once all are empty, none returned before every tray answered, one domain at a time; the
domain's own budget is exceeded for it, the pool's is not."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api import maintenanceplan
from gpufleet.domain import conditions, node_reports, well_known
from gpufleet.domain.policy import Budget, DomainBudget, Safety
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle.controller import Controller

from .fakes import FakeKube, set_annotation
from .test_controller import make, record, settle

DOMAIN = "network.topology.nvidia.com/accelerator"
SPEC = {"nodeSelector": {}, "action": "command", "command": "nvswitch-fw", "scope": "nvlinkDomain"}


async def setup(spec: dict[str, Any], **policy: Any) -> tuple[FakeKube, Controller]:
    """Six trays: n0-n2 in NVLink domain a, n3-n5 in b; k 1 per domain."""
    kube, ctl, _ = await make(6, **policy)
    for i, name in enumerate(sorted(kube.nodes)):
        kube.nodes[name]["metadata"]["labels"][DOMAIN] = "a" if i < 3 else "b"
        kube.nodes[name]["metadata"]["labels"]["example.com/pick"] = str(i == 0).lower()
        await ctl.on_node(kube.nodes[name])
    body = {"metadata": {"name": "fw", "generation": 1}, "spec": spec}
    kube.custom[(maintenanceplan.PLURAL, "fw")] = body
    ctl.on_plan(body)
    return kube, ctl


async def passes(ctl: Controller, n: int = 3) -> None:
    for _ in range(n):
        await ctl.plans.run()
        await settle(ctl)


def states(kube: FakeKube) -> dict[str, str]:
    return {n: record(kube, n).state.value for n in sorted(kube.nodes)}


def asked(kube: FakeKube, name: str) -> conditions.AgentRequest | None:
    text = kube.nodes[name]["metadata"]["annotations"].get(well_known.ANNOTATION_AGENT_REQUEST)
    return conditions.decode_request(text) if text else None


async def answer(kube: FakeKube, ctl: Controller, name: str, passed: bool = True) -> None:
    request = asked(kube, name)
    assert request is not None and request.kind == "command"
    result = conditions.AgentResult(request.id, passed, "flashed" if passed else "exit 1")
    set_annotation(kube.nodes[name], node_reports.result(result))
    await ctl.on_node(kube.nodes[name])
    await settle(ctl)


def budget() -> Safety:
    return Safety(
        budget=Budget(max_nodes=10, max_percent=100.0, per_domain=DomainBudget(max_nodes=1))
    )


def test_a_domain_is_emptied_acted_on_and_returned_as_one_then_the_next() -> None:
    async def go() -> None:
        kube, ctl = await setup(SPEC, safety=budget())
        await passes(ctl)
        # Every tray of a is out (k 1 exceeded with the plan's consent); b untouched.
        assert states(kube) == {
            **dict.fromkeys(("n0", "n1", "n2"), "maintenance"),
            **dict.fromkeys(("n3", "n4", "n5"), "production"),
        }
        # The command was asked of each tray of a only once all three were empty.
        for name in ("n0", "n1", "n2"):
            assert record(kube, name).incident.acting_since is not None
            assert asked(kube, name) is not None
        # Two answer: nobody returns while the third has not.
        await answer(kube, ctl, "n0")
        await answer(kube, ctl, "n1")
        await passes(ctl)
        assert {states(kube)[n] for n in ("n0", "n1", "n2")} == {"maintenance"}
        await answer(kube, ctl, "n2")
        await passes(ctl)
        assert {states(kube)[n] for n in ("n0", "n1", "n2")} == {"verifying"}
        assert {states(kube)[n] for n in ("n3", "n4", "n5")} == {"production"}
        status = kube.custom[(maintenanceplan.PLURAL, "fw")]["status"]
        assert {e["domain"] for e in status["nodes"]} == {"a", "b"}
        blocked = next(c for c in status["conditions"] if c["type"] == "Blocked")
        assert blocked["status"] == "False"
        # Verified and back: then, and only then, domain b goes out as one.
        for name in ("n0", "n1", "n2"):
            await checks_pass(kube, ctl, name)
        await passes(ctl)
        assert states(kube) == {
            **dict.fromkeys(("n0", "n1", "n2"), "production"),
            **dict.fromkeys(("n3", "n4", "n5"), "maintenance"),
        }

    asyncio.run(go())


async def checks_pass(kube: FakeKube, ctl: Controller, name: str) -> None:
    request = asked(kube, name)
    assert request is not None and request.kind == "checks"
    set_annotation(kube.nodes[name], node_reports.result(conditions.AgentResult(request.id, True)))
    await ctl.on_node(kube.nodes[name])
    await settle(ctl)


def test_a_domain_larger_than_the_pools_budget_is_refused_with_a_condition() -> None:
    async def go() -> None:
        safety = Safety(budget=Budget(max_nodes=2, max_percent=100.0))
        kube, ctl = await setup(SPEC, safety=safety)
        await passes(ctl)
        assert set(states(kube).values()) == {"production"}
        status = kube.custom[(maintenanceplan.PLURAL, "fw")]["status"]
        blocked = next(c for c in status["conditions"] if c["type"] == "Blocked")
        assert blocked["status"] == "True" and blocked["reason"] == "BudgetTooSmall"
        assert "NVLink domain a: its 3 trays can never be out at once" in status["message"]

    asyncio.run(go())


def test_a_domain_not_wholly_selected_is_not_started() -> None:
    async def go() -> None:
        spec = {**SPEC, "nodeSelector": {"example.com/pick": "true"}}
        kube, ctl = await setup(spec, safety=budget())
        await passes(ctl)
        assert set(states(kube).values()) == {"production"}
        status = kube.custom[(maintenanceplan.PLURAL, "fw")]["status"]
        assert "1 of its 3 trays selected" in status["message"]

    asyncio.run(go())


def test_a_paused_policy_starts_nothing_and_a_failed_tray_does_not_hold_the_others() -> None:
    async def go() -> None:
        kube, ctl = await setup(SPEC, safety=budget(), paused=True)
        await passes(ctl)
        assert set(states(kube).values()) == {"production"}
        ctl.policies.use(ctl.policies.effective().model_copy(update={"paused": False}))
        await passes(ctl)
        await answer(kube, ctl, "n0", passed=False)
        await answer(kube, ctl, "n1")
        await passes(ctl)
        assert states(kube)["n0"] == NodeState.TRIAGE.value
        assert states(kube)["n1"] == "maintenance"  # n2 has not answered
        await answer(kube, ctl, "n2")
        await passes(ctl)
        assert (states(kube)["n1"], states(kube)["n2"]) == ("verifying", "verifying")

    asyncio.run(go())
