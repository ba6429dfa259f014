"""MaintenancePlans in the controller, against an in-memory API: batches through the node
pass, the plan's status written only when it changes, nothing started under a paused policy."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.api import maintenanceplan
from gpufleet.domain import conditions, node_reports, well_known
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.policy import Budget, Safety
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.kubeapi import Patch, Resource
from gpufleet.lifecycle.controller import Controller

from .fakes import FakeKube, set_annotation, signed
from .test_controller import make, record, settle

RACK = "example.com/rack"


class CountingKube(FakeKube):
    """Counts the writes of a MaintenancePlan's status."""

    plan_writes = 0

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        status: bool = False,
        kind: Patch = Patch.MERGE,
    ) -> Any:
        if resource.plural == maintenanceplan.PLURAL and status:
            self.plan_writes += 1
        return await super().patch(
            resource, name, patch, namespace=namespace, status=status, kind=kind
        )


async def setup(spec: dict[str, Any], **policy: Any) -> tuple[CountingKube, Controller]:
    counting = CountingKube()
    _, ctl, _ = await make(4, kube=counting, **policy)
    for i, name in enumerate(sorted(counting.nodes)):
        counting.nodes[name]["metadata"]["labels"][RACK] = f"r{i // 2}"
        await ctl.on_node(counting.nodes[name])
    body = {"metadata": {"name": "p", "generation": 1}, "spec": spec}
    counting.custom[(maintenanceplan.PLURAL, "p")] = body
    ctl.on_plan(body)
    return counting, ctl


def plan_status(kube: FakeKube) -> dict[str, Any]:
    status: dict[str, Any] = kube.custom[(maintenanceplan.PLURAL, "p")].get("status") or {}
    return status


async def passes(ctl: Controller, n: int = 3) -> None:
    for _ in range(n):
        await ctl.plans.run()
        await settle(ctl)


def verify(kube: FakeKube, ctl: Controller, name: str) -> Any:
    ann = kube.nodes[name]["metadata"]["annotations"]
    request = conditions.decode_request(ann[well_known.ANNOTATION_AGENT_REQUEST])
    assert request is not None
    set_annotation(kube.nodes[name], node_reports.result(conditions.AgentResult(request.id, True)))
    return ctl.on_node(kube.nodes[name])


SPEC = {"nodeSelector": {}, "action": "noop", "failureDomainLabel": RACK, "maxUnavailable": 4}


def test_a_noop_plan_takes_one_node_per_rack_within_the_budget_and_completes() -> None:
    async def go() -> None:
        budget = Budget(max_nodes=2, min_nodes=2, max_percent=100.0)
        kube, ctl = await setup(SPEC, safety=Safety(budget=budget))
        await passes(ctl)
        states = {n: record(kube, n).state.value for n in sorted(kube.nodes)}
        assert states == {
            "n0": "verifying",
            "n1": "production",
            "n2": "verifying",
            "n3": "production",
        }
        status = plan_status(kube)
        assert (status["inProgress"], status["pending"], status["phase"]) == (2, 2, "Progressing")
        for name in ("n0", "n2"):
            await verify(kube, ctl, name)
        await passes(ctl)
        for name in ("n1", "n3"):
            assert record(kube, name).state.value == "verifying"
            await verify(kube, ctl, name)
        await passes(ctl)
        status = plan_status(kube)
        assert (status["phase"], status["progress"], status["succeeded"]) == ("Completed", "4/4", 4)
        assert all(record(kube, n).state.value == "production" for n in kube.nodes)
        await ctl.close()

    asyncio.run(go())


def test_the_status_is_written_only_when_it_changes() -> None:
    async def go() -> None:
        kube, ctl = await setup(SPEC)
        await passes(ctl)
        assert plan_status(kube)["inProgress"] == 1  # the default budget: 1 of 4
        before = kube.plan_writes
        await passes(ctl, 5)
        assert kube.plan_writes == before, "a pass with nothing new wrote the status"
        await verify(kube, ctl, "n0")
        await passes(ctl, 1)
        assert kube.plan_writes > before
        await ctl.close()

    asyncio.run(go())


def test_a_paused_fleet_policy_or_plan_starts_nothing() -> None:
    async def go() -> None:
        kube, ctl = await setup(SPEC, paused=True)
        await passes(ctl)
        assert plan_status(kube)["pending"] == 4
        assert "paused" in plan_status(kube)["message"]
        assert all(record(kube, n).state.value == "production" for n in kube.nodes)
        await ctl.close()
        kube, ctl = await setup({**SPEC, "paused": True})
        await passes(ctl)
        assert plan_status(kube)["phase"] == "Paused"
        assert all(record(kube, n).state.value == "production" for n in kube.nodes)
        await ctl.close()

    asyncio.run(go())


def test_an_aborted_plan_lets_the_node_out_finish_and_starts_no_other() -> None:
    async def go() -> None:
        kube, ctl = await setup(SPEC)
        await passes(ctl)
        assert record(kube, "n0").state.value == "verifying"
        body = kube.custom[(maintenanceplan.PLURAL, "p")]
        body["spec"] = {**SPEC, "abort": True}
        ctl.on_plan(body)
        await passes(ctl)
        assert plan_status(kube)["phase"] == "Aborted"
        await verify(kube, ctl, "n0")  # the node out finishes its cycle
        await passes(ctl)
        assert all(record(kube, n).state.value == "production" for n in kube.nodes)
        assert not any(kube.nodes[n]["spec"].get("unschedulable") for n in kube.nodes)
        status = plan_status(kube)
        assert (status["succeeded"], status["pending"], status["phase"]) == (1, 3, "Aborted")
        await ctl.close()

    asyncio.run(go())


def test_a_node_asked_for_that_left_production_meanwhile_is_not_taken_from_triage() -> None:
    async def go() -> None:
        kube, ctl = await setup({**SPEC, "nodeSelector": {RACK: "r0"}}, paused=True)
        body = kube.nodes["n1"]
        triaged = NodeRecord.new("n1", at=ctl.clock.now(), state=NodeState.TRIAGE, reason="x")
        body["metadata"]["annotations"].update(signed(ctl, triaged))
        body["metadata"]["labels"][well_known.LABEL_STATE] = "triage"
        await ctl.on_node(body)
        plan = kube.custom[(maintenanceplan.PLURAL, "p")]
        plan["status"] = {"nodes": [{"name": "n1", "phase": "Requested", "startedAt": 1.0}]}
        ctl.policies.use(ctl.policies.policy.model_copy(update={"paused": False}))
        ctl.on_plan(plan)
        await passes(ctl)
        entry = next(n for n in plan_status(kube)["nodes"] if n["name"] == "n1")
        assert entry["phase"] == "Pending" and "in triage" in entry["message"]
        assert "startedAt" not in entry
        assert record(kube, "n1").state is NodeState.TRIAGE
        assert record(kube, "n0").state is not NodeState.PRODUCTION  # n0 is taken instead
        await ctl.close()

    asyncio.run(go())


def test_a_late_watch_event_does_not_bring_back_an_older_plan() -> None:
    async def go() -> None:
        _, ctl = await setup(SPEC)
        newer = {"metadata": {"name": "p", "resourceVersion": "12"}, "spec": SPEC, "status": {}}
        ctl.on_plan(newer)
        ctl.on_plan({"metadata": {"name": "p", "resourceVersion": "9"}, "spec": SPEC})
        assert ctl.plans._plans["p"]["metadata"]["resourceVersion"] == "12"
        ctl.on_plan({"metadata": {"name": "p", "resourceVersion": "13"}, "spec": SPEC})
        assert ctl.plans._plans["p"]["metadata"]["resourceVersion"] == "13"
        await ctl.close()

    asyncio.run(go())


def test_a_plan_with_a_start_time_waits_for_it() -> None:
    async def go() -> None:
        kube, ctl, clock = await make(4)
        start = rfc3339(clock.now() + 60)
        body = {"metadata": {"name": "p"}, "spec": {**SPEC, "startAt": start}}
        kube.custom[(maintenanceplan.PLURAL, "p")] = body
        ctl.on_plan(body)
        await passes(ctl)
        status = plan_status(kube)
        assert status["phase"] == "Scheduled" and "start time" in status["message"]
        assert all(record(kube, n).state is NodeState.PRODUCTION for n in kube.nodes)
        clock.advance(61)
        await passes(ctl)
        assert plan_status(kube)["phase"] == "Progressing"
        assert record(kube, "n0").state is not NodeState.PRODUCTION
        await ctl.close()

    asyncio.run(go())


def test_a_plans_reimage_installs_the_plans_image_version() -> None:
    async def go() -> None:
        spec = {**SPEC, "action": "reimage", "image": "v2", "maxUnavailable": 1}
        kube, ctl = await setup(spec)
        await passes(ctl)
        taken = [n for n, r in ctl.fleet.records.items() if r.state is not NodeState.PRODUCTION]
        assert len(taken) == 1
        assert ctl.plans.reimage_version(taken[0]) == "v2"
        # Nodes the plan did not take, and plans that reimage nothing, name no version.
        others = [n for n in kube.nodes if n not in taken]
        assert all(ctl.plans.reimage_version(n) is None for n in others)
        ctl.on_plan(
            {"metadata": {"name": "p", "generation": 2}, "spec": {**SPEC, "action": "reboot"}}
        )
        assert ctl.plans.reimage_version(taken[0]) is None

    asyncio.run(go())
