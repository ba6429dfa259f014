"""Issue 33 in ``decide``: a refused act never escalates, a held fault is never dropped without
a Notice, and a held fault retried is not a new fault for the breaker."""

from __future__ import annotations

from gpufleet.domain import events as ev
from gpufleet.domain.actions import ActionKind
from gpufleet.domain.decide import MAX_REFUSALS
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import default_policy
from gpufleet.domain.records import Outcome
from gpufleet.domain.safety import Hold
from gpufleet.domain.states import NodeState

from .conftest import make_fleet, xid

S = NodeState


def _in_remediation(step: Step = Step.REBOOT) -> tuple[object, object]:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=10, gpu=3), now=10)
    f.send("n1", ev.DrainCompleted(), now=20)
    return f, f.records["n1"]


def test_work_found_drains_again_and_the_same_rung_comes_back_not_the_next() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=10, gpu=3), now=10)
    f.send("n1", ev.DrainCompleted(), now=20)
    assert f.state("n1") is S.REMEDIATING
    d = f.send("n1", ev.WorkFound(Step.REBOOT, "1 pod(s) on the node: default/p1"), now=30)
    assert f.state("n1") is S.DRAINING
    assert [a.kind for a in d.actions] == [ActionKind.DRAIN, ActionKind.NOTIFY]
    inc = f.records["n1"].incident
    assert inc is not None and not inc.drained and inc.refusals == 1
    assert inc.tried[-1].outcome is Outcome.REFUSED
    d = f.send("n1", ev.DrainCompleted(), now=40)
    assert [(a.kind, a.step) for a in d.actions] == [(ActionKind.RUN_STEP, Step.REBOOT)]
    inc = f.records["n1"].incident
    assert inc is not None and [a.attempt for a in inc.tried] == [1, 2]
    # The refused attempt does not count: a failure of the second still has no retry left
    # (reboot allows one attempt), so the ladder moves to power-cycle, not to triage.
    d = f.send("n1", ev.StepCompleted(Step.REBOOT, succeeded=False), now=50)
    assert [(a.kind, a.step) for a in d.actions] == [(ActionKind.RUN_STEP, Step.POWER_CYCLE)]


def test_a_node_that_keeps_getting_work_goes_to_triage_not_up_the_ladder() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=10, gpu=3), now=10)
    t = 20.0
    for _ in range(MAX_REFUSALS):
        f.send("n1", ev.DrainCompleted(), now=t)
        d = f.send("n1", ev.WorkFound(Step.REBOOT, "a pod keeps landing"), now=t + 1)
        t += 10
    assert f.state("n1") is S.TRIAGE
    assert "refused 3 times" in d.transition.reason
    inc = f.records["n1"].incident
    assert inc is not None and all(a.step is Step.REBOOT for a in inc.tried)


def test_a_refused_gpu_reset_never_escalates_to_a_reboot() -> None:
    policy = default_policy()
    f = make_fleet(10, policy)
    f.send("n1", xid("n1", 48, at=10, gpu=3), now=10)  # double-bit ECC: gpu-reset first
    f.send("n1", ev.DrainCompleted(), now=20)
    inc = f.records["n1"].incident
    assert inc is not None and inc.current is Step.GPU_RESET
    f.send("n1", ev.WorkFound(Step.GPU_RESET, "refused: processes run on the GPUs"), now=25)
    assert f.state("n1") is S.DRAINING
    timeout = policy.ladder_entry(Step.GPU_RESET)
    assert timeout is not None
    d = f.send("n1", ev.Tick(), now=20 + timeout.timeout_seconds + 1)
    assert not any(a.step is Step.REBOOT for a in d.actions)  # no escalation by timeout


def test_work_found_for_another_step_or_state_changes_nothing() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=10, gpu=3), now=10)
    before = f.records["n1"]
    d = f.send("n1", ev.WorkFound(Step.REBOOT, "x"), now=15)  # draining: no act in progress
    assert d.record == before and not d.actions


def test_a_later_fault_takes_a_held_one_into_its_incident_with_a_notice() -> None:
    f = make_fleet(10)  # budget 10 % of 10: one node
    f.send("n0", xid("n0", 79, at=0), now=0)
    d = f.send("n1", xid("n1", 79, at=1), now=1)
    assert d.hold is Hold.BUDGET_EXHAUSTED and f.records["n1"].pending is not None
    f.send("n0", ev.DrainCompleted(), now=2)
    f.send("n0", ev.StepCompleted(Step.REBOOT, succeeded=True), now=3)
    f.send("n0", ev.ChecksCompleted(passed=True), now=4)
    # Budget free again; a milder fault arrives before the tick retried the held one.
    d = f.send("n1", xid("n1", 13, at=5), now=5)
    d = f.send("n1", xid("n1", 13, at=6), now=6)
    d = f.send("n1", xid("n1", 13, at=7), now=7)  # third XID 13: takes the node out
    assert f.state("n1") is S.DRAINING
    notices = [a.detail for a in d.actions if a.kind is ActionKind.NOTIFY]
    assert any("held fault xid-79" in n for n in notices), d.actions
    inc = f.records["n1"].incident
    assert inc is not None and inc.plan is Step.REBOOT  # the held fault's more severe step


def test_a_held_fault_let_go_on_return_to_production_says_so() -> None:
    f = make_fleet(10)
    f.send("n0", xid("n0", 79, at=0), now=0)
    f.send("n1", xid("n1", 79, at=1), now=1)
    assert f.records["n1"].pending is not None
    f.send("n0", ev.DrainCompleted(), now=2)
    f.send("n0", ev.StepCompleted(Step.REBOOT, succeeded=True), now=3)
    f.send("n0", ev.ChecksCompleted(passed=True), now=4)
    f.send("n1", ev.OperatorTriage("look at it"), now=5)  # out with its fault held
    f.send("n1", ev.DrainCompleted(), now=6)
    assert f.state("n1") is S.TRIAGE
    f.send("n1", ev.OperatorReturn("fixed"), now=7)
    d = f.send("n1", ev.ChecksCompleted(passed=True), now=8)
    assert f.state("n1") is S.PRODUCTION and f.records["n1"].pending is None
    notices = [a.detail for a in d.actions if a.kind is ActionKind.NOTIFY]
    assert any("held fault xid-79 let go" in n for n in notices), d.actions


def test_a_held_fault_retried_is_not_a_new_fault_for_the_breaker() -> None:
    policy = default_policy()
    budget = policy.safety.budget.model_copy(update={"max_nodes": 2, "max_percent": 100.0})
    policy = policy.model_copy(
        update={"safety": policy.safety.model_copy(update={"budget": budget})}
    )
    f = make_fleet(100, policy)
    for i in range(2):
        f.send(f"n{i}", xid(f"n{i}", 79, at=0), now=0)
    d = f.send("n50", xid("n50", 79, at=1), now=1)
    assert d.hold is Hold.BUDGET_EXHAUSTED
    counted = len(f.view.breaker.recent)
    for t in range(2, 30):
        d = f.send("n50", ev.Tick(), now=float(t))  # retried every tick, still held
        assert d.hold is Hold.BUDGET_EXHAUSTED
    assert len(f.view.breaker.recent) == counted
    assert [n for _, n in f.view.breaker.recent].count("n50") == 1


def test_two_faults_held_at_once_keep_the_more_severe_and_say_so() -> None:
    f = make_fleet(10)  # budget: one node
    f.send("n0", xid("n0", 79, at=0), now=0)
    d = f.send("n1", xid("n1", 48, at=1, gpu=1), now=1)  # gpu-reset, held
    assert d.hold is Hold.BUDGET_EXHAUSTED and f.records["n1"].pending_step is Step.GPU_RESET
    d = f.send("n1", xid("n1", 79, at=2), now=2)  # reboot, held too: it takes the place
    assert d.hold is Hold.BUDGET_EXHAUSTED
    assert f.records["n1"].pending is not None and f.records["n1"].pending.xid == 79
    notices = [a.detail for a in d.actions if a.kind is ActionKind.NOTIFY]
    assert any("held fault xid-48" in n and "xid-79" in n for n in notices), d.actions
    d = f.send("n1", xid("n1", 48, at=3, gpu=2), now=3)  # milder again: held with 79
    notices = [a.detail for a in d.actions if a.kind is ActionKind.NOTIFY]
    assert any("is held with xid-79" in n for n in notices), d.actions
    assert f.records["n1"].pending is not None and f.records["n1"].pending.xid == 79
    d = f.send("n1", ev.Tick(), now=4)  # a retry of the held one says nothing new
    assert not [a for a in d.actions if a.kind is ActionKind.NOTIFY]
