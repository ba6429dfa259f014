"""The agent judges with the controller's FleetPolicy and keeps a fault visible until the
controller has recorded it (issue 33, defects 8 and 10, agent side).

Live: tests/integration/test_safety_agent.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gpufleet.domain import conditions, debounce, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.policy import Detection, Policy, default_policy
from gpufleet.health.agent import Agent
from gpufleet.health.backend_sim import SimulatedHardware
from gpufleet.health.fleet_policy import FleetPolicyFollower, policy_of
from gpufleet.health.metrics import AgentMetrics
from gpufleet.health.skus import bundled

from .test_cli_and_agent import ListReporter

GPU = well_known.CONDITIONS[Subsystem.GPU]
QUICK = Detection(raise_after_seconds=0, clear_after_seconds=2.0)


def xid(at: float, number: int = 79) -> FaultEvent:
    return FaultEvent(FaultKind.XID, "n1", at=at, xid=number, evidence=Evidence(gpu_index=3))


# ---------------------------------------------------------------- the rule


def test_a_raised_condition_clears_only_once_the_controller_recorded_it() -> None:
    raised = debounce.observe(
        debounce.ConditionState(), debounce.Observation(100.0, instant=(xid(100.0),)), QUICK
    )
    assert raised.problem
    quiet = debounce.Observation(150.0)  # long past the clear time
    assert debounce.observe(raised, quiet, QUICK, recorded_until=float("-inf")).problem
    assert debounce.observe(raised, quiet, QUICK, recorded_until=99.0).problem
    assert not debounce.observe(raised, quiet, QUICK, recorded_until=100.0).problem
    assert not debounce.observe(raised, quiet, QUICK).problem  # no controller to wait for
    # An unreadable monitor does not drop an unrecorded fault either.
    blind = debounce.Observation(150.0, readable=False, unreadable_reason="nvml gone")
    assert debounce.observe(raised, blind, QUICK, recorded_until=None).status.value == "Unknown"
    assert debounce.observe(raised, blind, QUICK, recorded_until=50.0).problem


def test_a_previous_agents_unrecorded_condition_is_taken_over() -> None:
    taken = debounce.adopt(debounce.ConditionState(), [xid(90.0), xid(95.0)], now=200.0)
    assert taken.problem and [f.at for f in taken.faults] == [90.0, 95.0]
    assert taken.last_bad == 95.0 and not debounce.recorded(taken, 94.0)


def test_the_watermark_decodes_to_nothing_when_it_is_not_what_the_controller_writes() -> None:
    assert conditions.faults_recorded('{"GpuProblem": 12.5, "x": true}') == {"GpuProblem": 12.5}
    for bad in (None, "", "[1]", "not json", '{"GpuProblem": "soon"}'):
        assert conditions.faults_recorded(bad) == {}


# ------------------------------------------------------ the agent and its Node


class NodeReporter(ListReporter):
    """The agent's Kubernetes side in memory: its Node carries what it last wrote and
    the controller's watermark, which the test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.recorded: dict[str, float] = {}
        self.left: list[dict[str, Any]] = []
        """Conditions on the Node before this agent wrote any (a previous agent's)."""

    async def node_object(self) -> dict[str, Any]:
        written = [
            {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
            for c in self.conditions.values()
        ]
        return {
            "metadata": {
                "name": "n1",
                "annotations": {well_known.ANNOTATION_FAULTS_SEEN: json.dumps(self.recorded)},
            },
            "status": {"conditions": written or self.left},
        }

    async def pods_on_node(self) -> list[dict[str, Any]]:
        return []

    async def node_event(self, **_: Any) -> None:
        pass


def agent_for(
    rep: ListReporter, policy: Policy | None = None, *, follow: bool = False
) -> tuple[Agent, SimulatedHardware]:
    hw = SimulatedHardware(node="n1")
    base = (policy or default_policy()).model_copy(update={"detection": QUICK})
    source = FleetPolicyFollower(_no_api, "default") if follow else None
    agent = Agent(
        hw,
        bundled().get("h100-sxm"),
        base,
        node="n1",
        reporter=rep,
        metrics=AgentMetrics("n1"),
        policy_source=source,
    )
    return agent, hw


async def _no_api() -> Any:  # pragma: no cover (the follower is not run here)
    raise AssertionError("not connected in unit tests")


def poll(agent: Agent, at: float, *, read: bool = True) -> None:
    """One pass of the agent's loop at ``at``: poll, publish, read its Node."""
    agent.clock = lambda: at

    async def go() -> None:
        changed, events = agent.step(at)
        await agent.publish(changed, events, at)
        if read:
            await agent._read_node(at)

    asyncio.run(go())


def test_the_agent_keeps_a_gone_fault_raised_until_the_watermark_covers_it() -> None:
    rep = NodeReporter()
    agent, hw = agent_for(rep)
    try:
        poll(agent, 100.0)
        hw.inject("xid=79,gpu=3")
        poll(agent, 101.0)
        (fault,) = conditions.faults_of("n1", GPU, "True", rep.conditions[GPU].message)
        hw.recover()
        for t in range(102, 160, 3):  # no controller: 58 s, the clear time is 2 s
            poll(agent, float(t))
            assert rep.conditions[GPU].status == "True"
        rep.recorded = {GPU: fault.at - 0.001}  # an older occurrence recorded: not enough
        poll(agent, 170.0)
        poll(agent, 176.0)
        assert rep.conditions[GPU].status == "True"
        rep.recorded = {GPU: fault.at}  # the controller stored its decision
        poll(agent, 182.0)  # read: the watermark arrives
        poll(agent, 183.0)
        assert rep.conditions[GPU].status == "False"
    finally:
        hw.close()


def test_a_new_agent_takes_over_an_unrecorded_condition_before_writing_any() -> None:
    first = NodeReporter()
    agent, hw = agent_for(first)
    try:
        poll(agent, 100.0)
        hw.inject("xid=79,gpu=3")
        poll(agent, 101.0)
    finally:
        hw.close()
    left = first.conditions[GPU]
    # The agent restarts (a new process, on a recovered GPU); the controller never acted.
    second = NodeReporter()
    second.left = [
        {"type": left.type, "status": left.status, "reason": left.reason, "message": left.message}
    ]
    agent, hw = agent_for(second)
    try:
        poll(agent, 300.0, read=False)  # the Node not read yet: nothing "healthy" is written
        assert GPU not in second.conditions
        asyncio.run(agent._read_node(300.5))
        poll(agent, 301.0)
        assert second.conditions[GPU].status == "True"
        assert second.conditions[GPU].message == left.message  # the same evidence
        for t in (310.0, 320.0):
            poll(agent, t)
            assert second.conditions[GPU].status == "True"
        (fault,) = conditions.faults_of("n1", GPU, "True", left.message)
        second.left, second.recorded = [], {GPU: fault.at}
        poll(agent, 330.0)
        poll(agent, 331.0)
        assert second.conditions[GPU].status == "False"
    finally:
        hw.close()


# ------------------------------------------------------------------ the policy


def _policy_where_xid13_reboots() -> dict[str, Any]:
    spec: dict[str, Any] = default_policy().model_dump(by_alias=True, mode="json")
    for rule in spec["rules"]:
        if rule["match"].get("xid") == 13:
            rule.update(action="reboot", repeat=None)
    return spec


def test_the_condition_follows_the_fleetpolicy_and_fails_closed_before_one_is_read() -> None:
    # XID 13: the built-in policy restarts the job (no condition); the FleetPolicy reboots.
    follower = FleetPolicyFollower(_no_api, "default")
    fleet = follower.apply({"metadata": {"generation": 1}, "spec": _policy_where_xid13_reboots()})
    assert fleet is not None and follower.valid
    for policy, follow, raised in (
        (None, False, False),  # the built-in policy, given (an agent without a controller)
        (None, True, True),  # no FleetPolicy read yet: fail closed, raised
        (fleet, False, True),  # the FleetPolicy in use
    ):
        rep = ListReporter()
        agent, hw = agent_for(rep, policy, follow=follow)
        try:
            poll(agent, 100.0)
            hw.inject("xid=13,gpu=0")
            poll(agent, 101.0)
            assert (rep.conditions[GPU].status == "True") is raised, (policy, follow)
            assert rep.events == ["Xid13"]  # an Event either way
        finally:
            hw.close()


def test_a_read_policy_ends_fail_closed_and_an_invalid_one_keeps_the_last_valid() -> None:
    rep = ListReporter()
    agent, hw = agent_for(rep, follow=True)
    follower = agent.policy_source
    assert follower is not None and not agent.policy_read
    try:
        built_in = follower.apply({"spec": default_policy().model_dump(by_alias=True, mode="json")})
        assert built_in is not None
        agent.use_policy(built_in)
        poll(agent, 100.0)
        hw.inject("xid=13,gpu=0")
        poll(agent, 101.0)
        assert rep.conditions[GPU].status == "False"  # judged by the policy read
        broken = _policy_where_xid13_reboots()
        broken["ladder"] = []  # the reboot rule now names a step the ladder lacks
        assert follower.apply({"spec": broken}) is None
        assert follower.valid is False and follower.policy == built_in
        assert "keeping the last valid one" in follower.problem
        assert follower.apply(None) is None and follower.policy == built_in  # deleted
    finally:
        hw.close()


def test_the_spec_is_validated_as_the_controller_validates_it() -> None:
    spec = default_policy().model_dump(by_alias=True, mode="json")
    assert policy_of({"spec": spec}, "default") == default_policy()


def test_the_agent_judges_with_the_override_its_nodes_labels_match() -> None:
    """XID 13 restarts the job fleet-wide; an override for rack a reboots. The agent on a
    node of rack a raises the condition (the controller must hear of it); on rack b not."""
    spec = default_policy().model_dump(by_alias=True, mode="json")
    spec["overrides"] = [
        {
            "name": "rack-a",
            "nodeSelector": {"matchLabels": {"example.com/rack": "a"}},
            "rules": [{"match": {"xid": 13}, "action": "reboot"}],
        }
    ]
    follower = FleetPolicyFollower(_no_api, "default")
    fleet = follower.apply({"spec": spec})
    assert fleet is not None
    for rack, raised in (("a", True), ("b", False)):
        rep = ListReporter()
        agent, hw = agent_for(rep, follow=True)
        try:
            agent.use_policy(fleet.model_copy(update={"detection": QUICK}))
            agent.offer_node({"metadata": {"name": "n1", "labels": {"example.com/rack": rack}}})
            assert agent.policy.group == ("rack-a" if raised else "")
            poll(agent, 100.0, read=False)
            hw.inject("xid=13,gpu=0")
            poll(agent, 101.0, read=False)
            assert (rep.conditions[GPU].status == "True") is raised, rack
        finally:
            hw.close()
