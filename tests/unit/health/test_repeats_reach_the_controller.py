"""A repeat rule judged by the agent must reach the controller as the same count.

The agent raises a condition only when the policy takes the node out; for a
repeat rule (three IB link flaps within 10 minutes) the condition must carry
all three occurrences, or the controller, replaying it, would count one and
only log.
"""

from __future__ import annotations

import asyncio

from gpufleet.domain import conditions
from gpufleet.domain import events as ev
from gpufleet.domain.decide import decide
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.states import NodeState

from .test_cli_and_agent import make_agent


def test_three_flaps_raise_a_condition_that_the_controller_acts_on() -> None:
    agent, hw, rep = make_agent()
    try:
        t = 1000.0
        for _ in range(2):
            changed, events = agent.step(t)
            asyncio.run(agent.publish(changed, events, t))
            hw.inject("ib-link-flap,hca=mlx5_2")
            t += 10
        changed, events = agent.step(t)
        asyncio.run(agent.publish(changed, events, t))
        assert rep.conditions["InfinibandProblem"].status == "False"  # two flaps: logged only
        hw.inject("ib-link-flap,hca=mlx5_2")
        t += 10
        changed, events = agent.step(t)
        asyncio.run(agent.publish(changed, events, t))
        cond = rep.conditions["InfinibandProblem"]
        assert (cond.status, cond.reason) == ("True", "IbLinkFlap")
        faults = conditions.faults_of("n1", cond.type, cond.status, cond.message)
        assert len(faults) == 3, cond.message

        # The controller's side: replay the condition into a production node.
        others = [NodeRecord.new(f"m{i}", at=0, state=NodeState.PRODUCTION) for i in range(20)]
        record = NodeRecord.new("n1", at=0, state=NodeState.PRODUCTION)
        fleet = FleetView.of([record, *others])
        for fault in faults:
            record = decide(record, fleet, ev.FaultObserved(fault), agent.policy, t).record
        assert record.state is NodeState.DRAINING
        assert record.incident is not None and record.incident.key == "ib-link-flap"
    finally:
        hw.close()


def test_a_scheduled_active_check_that_finds_sdc_raises_the_condition() -> None:
    agent, hw, rep = make_agent()
    try:
        changed, events = agent.step(10.0)
        asyncio.run(agent.publish(changed, events, 10.0))
        assert rep.conditions["GpuProblem"].status == "False"
        hw.inject("sdc-mismatch,gpu=4")
        results = agent.run_active(11.0)
        assert any(r.name == "sdc" and r.failed for r in results)
        changed, events = agent.step(12.0)
        asyncio.run(agent.publish(changed, events, 12.0))
        cond = rep.conditions["GpuProblem"]
        assert (cond.status, cond.reason) == ("True", "SdcMismatch")
        faults = conditions.faults_of("n1", cond.type, cond.status, cond.message)
        assert [f.evidence.gpu_index for f in faults] == [4]
        # A slow GPU found by the GEMM check raises PerformanceProblem, and it clears
        # once the checks pass again (the agent keeps observing a raised subsystem).
        hw.recover()
        hw.inject("gemm-below-threshold,gpu=1")
        agent.run_active(13.0)
        changed, events = agent.step(14.0)
        asyncio.run(agent.publish(changed, events, 14.0))
        assert rep.conditions["PerformanceProblem"].status == "True"
        hw.recover()
        for t in (20.0, 30.0):  # clearAfterSeconds is 2 in make_agent()
            changed, events = agent.step(t)
            asyncio.run(agent.publish(changed, events, t))
        assert rep.conditions["PerformanceProblem"].status == "False"
    finally:
        hw.close()
