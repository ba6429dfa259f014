"""Scenarios through decide(): what a node goes through, one event at a time."""

from __future__ import annotations

from dataclasses import replace

import yaml

from gpufleet.domain import events as ev
from gpufleet.domain.actions import ActionKind
from gpufleet.domain.decide import decide
from gpufleet.domain.defaults import DEFAULT_POLICY_YAML
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import (
    DrainMode,
    Policy,
    RequeueMode,
    TaintEffect,
    default_policy,
    load_policy,
)
from gpufleet.domain.records import NodeRecord, Outcome, record_from_json, record_to_json
from gpufleet.domain.safety import Hold
from gpufleet.domain.states import NodeState

from .conftest import fault, make_fleet, xid

S = NodeState


def _policy(**top: object) -> Policy:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data.update(top)
    return load_policy(yaml.safe_dump(data))


def kinds(d: object) -> list[ActionKind]:
    return [a.kind for a in d.actions]  # type: ignore[attr-defined]


def test_xid79_full_recovery() -> None:
    f = make_fleet(10)
    d = f.send("n1", xid("n1", 79, at=10, gpu=3, pci_bus_id="0000:1b:00.0"), now=10)
    assert f.state("n1") is S.DRAINING
    assert kinds(d) == [ActionKind.CORDON, ActionKind.TAINT, ActionKind.DRAIN]
    assert d.actions[1].taint is TaintEffect.NO_EXECUTE
    assert d.actions[2].drain_mode is DrainMode.EVICT
    assert d.actions[2].requeue is RequeueMode.NOW
    assert d.transition.reason.startswith("xid79 gpu3")
    d = f.send("n1", ev.DrainCompleted(), now=20)
    assert f.state("n1") is S.REMEDIATING
    assert [(a.kind, a.step) for a in d.actions] == [(ActionKind.RUN_STEP, Step.REBOOT)]
    d = f.send("n1", ev.StepCompleted(Step.REBOOT, succeeded=True), now=200)
    assert f.state("n1") is S.VERIFYING
    assert kinds(d) == [ActionKind.TAINT, ActionKind.RUN_CHECKS]
    assert d.actions[1].profile == "verify"
    d = f.send("n1", ev.ChecksCompleted(passed=True), now=300)
    assert f.state("n1") is S.PRODUCTION
    assert kinds(d) == [ActionKind.UNTAINT, ActionKind.UNCORDON]
    rec = f.records["n1"]
    assert rec.incident is None
    assert [t.target for t in rec.history] == [S.DRAINING, S.REMEDIATING, S.VERIFYING, S.PRODUCTION]
    assert all(t.reason for t in rec.history)
    assert [t.at for t in rec.history] == [10, 20, 200, 300]


def test_xid13_once_keeps_the_node_and_three_on_one_gpu_take_it_out() -> None:
    f = make_fleet(10)
    d = f.send("n1", xid("n1", 13, at=1, gpu=2), now=1)
    assert kinds(d) == [ActionKind.RESTART_JOB]
    assert f.state("n1") is S.PRODUCTION
    # Repeats on *other* GPUs do not count for GPU 2.
    f.send("n1", xid("n1", 13, at=2, gpu=5), now=2)
    f.send("n1", xid("n1", 13, at=3, gpu=2), now=3)
    assert f.state("n1") is S.PRODUCTION
    d = f.send("n1", xid("n1", 13, at=4, gpu=2), now=4)
    assert f.state("n1") is S.DRAINING
    assert "3 occurrences on gpu2" in d.reasons[0]
    assert f.records["n1"].incident.plan is Step.GPU_RESET


def test_repeats_outside_the_window_do_not_count() -> None:
    f = make_fleet(10)
    for t in (0, 2000, 4000, 6000):
        f.send("n1", xid("n1", 13, at=t, gpu=2), now=t)
    assert f.state("n1") is S.PRODUCTION


def test_same_observation_twice_is_counted_once() -> None:
    f = make_fleet(10)
    for _ in range(5):
        f.send("n1", xid("n1", 13, at=7, gpu=2), now=8)
    assert f.state("n1") is S.PRODUCTION
    assert len(f.records["n1"].occurrences) == 1


def test_ladder_escalates_on_failure_and_timeout_then_triage() -> None:
    f = make_fleet(10)
    f.send("n1", fault("n1", FaultKind.ECC_UNCORRECTABLE, at=0, gpu_index=1), now=0)
    d = f.send("n1", ev.DrainCompleted(), now=1)
    assert d.actions[0].step is Step.GPU_RESET
    d = f.send(
        "n1", ev.StepCompleted(Step.GPU_RESET, succeeded=False, detail="reset refused"), now=2
    )
    assert d.actions[0].step is Step.REBOOT
    # No answer from the BMC within the reboot timeout (1200 s): a Tick escalates.
    assert not f.send("n1", ev.Tick(), now=500).actions
    d = f.send("n1", ev.Tick(), now=1202)
    assert d.actions[0].step is Step.POWER_CYCLE
    tried = f.records["n1"].incident.tried
    assert [(a.step, a.outcome) for a in tried] == [
        (Step.GPU_RESET, Outcome.FAILED),
        (Step.REBOOT, Outcome.TIMED_OUT),
        (Step.POWER_CYCLE, None),
    ]
    f.send("n1", ev.StepCompleted(Step.POWER_CYCLE, succeeded=False), now=1300)
    d = f.send("n1", ev.StepCompleted(Step.REIMAGE, succeeded=False), now=1400)
    assert f.state("n1") is S.TRIAGE
    assert kinds(d) == [ActionKind.NOTIFY]


def test_failed_verification_escalates_from_the_step_that_ran() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=0), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    f.send("n1", ev.StepCompleted(Step.REBOOT, succeeded=True), now=2)
    d = f.send("n1", ev.ChecksCompleted(passed=False, detail="GEMM 400 TFLOP/s < 600"), now=3)
    assert f.state("n1") is S.REMEDIATING
    assert d.actions[0].step is Step.POWER_CYCLE
    assert "verification failed: GEMM" in d.reasons[0]


def test_verification_timeout_counts_as_failure() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=0), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    f.send("n1", ev.StepCompleted(Step.REBOOT, succeeded=True), now=2)
    d = f.send("n1", ev.Tick(), now=2 + 1800)
    assert f.state("n1") is S.REMEDIATING
    assert d.actions[0].step is Step.POWER_CYCLE


def test_stale_step_results_are_ignored() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=0), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    d = f.send("n1", ev.StepCompleted(Step.GPU_RESET, succeeded=True), now=2)
    assert f.state("n1") is S.REMEDIATING
    assert not d.actions and "not the step in progress" in d.reasons[0]


def test_in_progress_step_is_never_issued_twice() -> None:
    """A restarted controller sends Tick: it must not start the reboot again."""
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=0), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    stored = record_to_json(f.records["n1"])
    restored = record_from_json(stored)
    assert restored == f.records["n1"]
    for t in (5, 50, 500, 1000):
        d = decide(restored, f.view, ev.Tick(), f.policy, t)
        assert not [a for a in d.actions if a.kind is ActionKind.RUN_STEP]


def _repaired(f: object, node: str, code: int, t: float, gpu: int) -> None:
    f.send(node, xid(node, code, at=t, gpu=gpu), now=t)  # type: ignore[attr-defined]
    f.send(node, ev.DrainCompleted(), now=t + 1)  # type: ignore[attr-defined]
    f.send(node, ev.StepCompleted(Step.REBOOT, succeeded=True), now=t + 2)  # type: ignore[attr-defined]
    f.send(node, ev.ChecksCompleted(passed=True), now=t + 3)  # type: ignore[attr-defined]


def test_lemon_node_goes_to_triage() -> None:
    """Three GPU hardware incidents on three GPUs a day apart: score 1 + 0.95 + 0.91 >= 2.5."""
    f = make_fleet(10)
    day = 86400.0
    for i in range(2):
        _repaired(f, "n1", 79, i * day, gpu=i)
        assert f.state("n1") is S.PRODUCTION
    d = f.send("n1", xid("n1", 79, at=2 * day, gpu=2), now=2 * day)
    assert any(r.startswith("lemon: lemon score 2.8") and "triage" in r for r in d.reasons)
    assert f.records["n1"].incident.plan is Step.TRIAGE
    f.send("n1", ev.DrainCompleted(), now=2 * day + 1)
    assert f.state("n1") is S.TRIAGE


def test_two_incidents_alone_are_repaired_again() -> None:
    f = make_fleet(10)
    day = 86400.0
    _repaired(f, "n1", 79, 0.0, gpu=3)
    d = f.send("n1", xid("n1", 79, at=day, gpu=3), now=day)
    assert not any(r.startswith("lemon") for r in d.reasons)
    assert f.records["n1"].incident.plan is Step.REBOOT  # gpu3 at 1.95, under 2.0


def test_one_gpu_with_two_incidents_and_more_trouble_is_a_lemon() -> None:
    f = make_fleet(10)
    day = 86400.0
    _repaired(f, "n1", 79, 0.0, gpu=3)
    f.send("n1", xid("n1", 92, at=day - 60, gpu=3), now=day - 60)  # logged: informational
    d = f.send("n1", xid("n1", 79, at=day, gpu=3), now=day)
    assert any("lemon score of gpu3 2.05 >= 2" in r for r in d.reasons)  # node: 2.05 < 2.5
    assert f.records["n1"].incident.plan is Step.TRIAGE


def test_incidents_weeks_apart_decay_below_the_threshold() -> None:
    f = make_fleet(10)
    week = 7 * 86400.0
    for i in range(3):
        _repaired(f, "n1", 79, i * week, gpu=i)
    assert f.state("n1") is S.PRODUCTION
    score = f.records["n1"].lemon
    assert score is not None and 2.2 < score.node < 2.25  # 1 + 0.71 + 0.5


def test_budget_holds_then_tick_retries_when_a_node_returns() -> None:
    f = make_fleet(10)  # 10% of 10 = 1 node may be out
    f.send("n0", xid("n0", 79, at=0), now=0)
    d = f.send("n1", xid("n1", 79, at=1000), now=1000)
    assert d.hold is Hold.BUDGET_EXHAUSTED
    assert f.state("n1") is S.PRODUCTION
    assert f.records["n1"].pending is not None
    assert [a.kind for a in d.withheld] == [ActionKind.CORDON, ActionKind.TAINT, ActionKind.DRAIN]
    assert f.send("n1", ev.Tick(), now=1002).hold is Hold.BUDGET_EXHAUSTED
    f.send("n0", ev.DrainCompleted(), now=1003)
    f.send("n0", ev.StepCompleted(Step.REBOOT, succeeded=True), now=1004)
    f.send("n0", ev.ChecksCompleted(passed=True), now=1005)
    d = f.send("n1", ev.Tick(), now=1006)
    assert d.hold is None and f.state("n1") is S.DRAINING
    assert f.records["n1"].pending is None


def test_held_fault_that_clears_stays_pending_and_is_acted_on_when_the_budget_frees() -> None:
    # Budget 1 of 10 nodes: XID 79 on two nodes; the second is held, its condition
    # clears 3 s later, and it is still repaired once the first node is back.
    f = make_fleet(10)
    f.send("n0", xid("n0", 79, at=0), now=0)
    d = f.send("n1", xid("n1", 79, at=1), now=1)
    assert d.hold is Hold.BUDGET_EXHAUSTED
    f.send("n1", ev.FaultCleared("xid-79"), now=4)
    assert f.records["n1"].pending is not None
    assert f.records["n1"].pending_step is Step.REBOOT
    f.send("n0", ev.DrainCompleted(), now=5)
    f.send("n0", ev.StepCompleted(Step.REBOOT, succeeded=True), now=6)
    f.send("n0", ev.ChecksCompleted(passed=True), now=7)
    d = f.send("n1", ev.Tick(), now=8)
    assert d.hold is None and f.state("n1") is S.DRAINING
    assert f.records["n1"].incident is not None
    assert f.records["n1"].incident.plan is Step.REBOOT
    assert f.records["n1"].pending is None and f.records["n1"].pending_step is None


def test_held_fault_keeps_its_step_after_its_occurrences_age_out() -> None:
    # ib-port-down escalates only on repeats; once held, the decided step stands
    # even when the repeats fall out of the window while the budget is used up.
    policy = default_policy()
    rule = policy.rule_for(
        FaultEvent(FaultKind.IB_PORT_DOWN, "n1", at=0, evidence=Evidence(hca="mlx5_0", port=1))
    )
    f = make_fleet(10)
    f.send("n0", xid("n0", 79, at=0), now=0)
    d = None
    for i in range(8):
        d = f.send("n1", fault("n1", FaultKind.IB_PORT_DOWN, at=i, hca="mlx5_0", port=1), now=i)
        if d.hold is not None:
            break
    assert d is not None and d.hold is Hold.BUDGET_EXHAUSTED
    step = f.records["n1"].pending_step
    assert step is not None
    window = rule.repeat.window_seconds if rule.repeat else 0.0
    later = 10 + window + 1
    f.send("n0", ev.DrainCompleted(), now=later - 3)
    f.send("n0", ev.StepCompleted(Step.REBOOT, succeeded=True), now=later - 2)
    f.send("n0", ev.ChecksCompleted(passed=True), now=later - 1)
    d = f.send("n1", ev.Tick(), now=later)
    assert d.hold is None and f.state("n1") is S.DRAINING
    assert f.records["n1"].incident is not None and f.records["n1"].incident.plan is step


def test_a_more_severe_held_fault_is_not_replaced_by_a_milder_one() -> None:
    f = make_fleet(10)
    f.send("n0", xid("n0", 79, at=0), now=0)
    f.send("n1", xid("n1", 79, at=1), now=1)
    first = f.records["n1"].pending_step
    f.send("n1", xid("n1", 48, at=2), now=2)
    assert f.records["n1"].pending_step is first
    assert f.records["n1"].pending is not None and f.records["n1"].pending.xid == 79


def test_held_fault_let_go_only_with_a_notice_when_the_policy_no_longer_asks() -> None:
    f = make_fleet(10)
    f.send("n0", xid("n0", 79, at=0), now=0)
    f.send("n1", xid("n1", 79, at=1), now=1)
    rec = replace(f.records["n1"], pending_step=None)
    rules = yaml.safe_load(DEFAULT_POLICY_YAML)["rules"]
    for rule in rules:
        if rule["match"] == {"xid": 79}:
            rule.clear()
            rule.update({"match": {"xid": 79}, "action": "log"})
    logs_only = _policy(rules=rules)
    d = decide(rec, f.view, ev.Tick(), logs_only, 2)
    assert d.record.pending is None
    assert [a.kind for a in d.actions] == [ActionKind.NOTIFY]
    assert "let go" in d.actions[0].detail


def test_pause_and_dry_run_change_nothing() -> None:
    for flag, hold in (("paused", Hold.PAUSED), ("dryRun", Hold.DRY_RUN)):
        f = make_fleet(10, policy=_policy(**{flag: True}))
        d = f.send("n1", xid("n1", 79, at=0), now=0)
        assert d.hold is hold
        assert not d.actions and d.withheld
        assert f.state("n1") is S.PRODUCTION
        assert d.transition is None


def test_circuit_breaker_trips_holds_and_resets_after_cooldown() -> None:
    # 100 nodes: budget 10, breaker threshold 10 nodes in 600 s.
    f = make_fleet(100)
    held = []
    for i in range(15):
        d = f.send(f"n{i}", xid(f"n{i}", 79, at=i), now=i)
        held.append(d.hold)
    assert held[:10] == [None] * 10
    assert held[10:] == [Hold.BREAKER_OPEN] * 5
    assert f.view.breaker.is_open and f.view.breaker.tripped_at == 10
    # While open, ladder steps of nodes already out are held too.
    assert f.send("n0", ev.DrainCompleted(), now=20).hold is Hold.BREAKER_OPEN
    assert f.state("n0") is S.DRAINING and f.records["n0"].incident.drained
    # Quiet for the cooldown (1800 s after the last fault): it closes, work resumes.
    d = f.send("n0", ev.Tick(), now=14 + 1800)
    assert not f.view.breaker.is_open
    assert d.hold is None and f.state("n0") is S.REMEDIATING


def test_rate_limit_holds_disruptive_actions() -> None:
    data = yaml.safe_load(DEFAULT_POLICY_YAML)
    data["safety"]["rateLimit"] = {"maxActions": 2, "windowSeconds": 100}
    f = make_fleet(100, policy=load_policy(yaml.safe_dump(data)))
    assert f.send("n1", xid("n1", 79, at=0), now=0).hold is None
    assert f.send("n2", xid("n2", 79, at=1), now=1).hold is None
    assert f.send("n3", xid("n3", 79, at=2), now=2).hold is Hold.RATE_LIMITED
    assert f.send("n3", ev.Tick(), now=101).hold is None


def test_application_xid_never_takes_a_node_out_even_when_budget_is_free() -> None:
    f = make_fleet(10)
    for code in (8, 13, 31, 43, 45, 68, 69, 94):
        d = f.send("n1", xid("n1", code, at=code), now=code)
        assert f.state("n1") is S.PRODUCTION, code
        assert not any(a.kind in (ActionKind.CORDON, ActionKind.DRAIN) for a in d.actions)


def test_xid154_follows_the_drivers_recovery_action() -> None:
    f = make_fleet(100)
    f.send("n1", xid("n1", 154, at=0, gpu=0, recovery_action="node-reboot"), now=0)
    assert f.records["n1"].incident.plan is Step.REBOOT
    f.send("n2", xid("n2", 154, at=0, gpu=0, recovery_action="gpu-reset"), now=0)
    assert f.records["n2"].incident.plan is Step.GPU_RESET


def test_more_severe_fault_while_draining_raises_the_plan_and_taint() -> None:
    f = make_fleet(10)
    f.send("n1", fault("n1", FaultKind.GEMM_BELOW_THRESHOLD, at=0, gpu_index=0), now=0)
    assert f.records["n1"].incident.taint is TaintEffect.NO_SCHEDULE
    d = f.send("n1", xid("n1", 79, at=1), now=1)
    inc = f.records["n1"].incident
    assert inc.plan is Step.REBOOT and inc.taint is TaintEffect.NO_EXECUTE
    assert [a.taint for a in d.actions] == [TaintEffect.NO_EXECUTE]


def test_direct_rma_and_triage_rules() -> None:
    f = make_fleet(10)
    f.send("n1", fault("n1", FaultKind.ROW_REMAP_FAILED, at=0, gpu_index=4), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    assert f.state("n1") is S.RMA
    assert f.send("n1", ev.OperatorReturn("x"), now=2).transition is None
    d = f.send("n1", ev.HardwareReplaced("baseboard swapped"), now=3)
    assert f.state("n1") is S.PROVISIONING and d.transition is not None
    assert f.records["n1"].lemon is None and f.records["n1"].occurrences == ()


def test_day0_day1_burn_in_and_mismatch() -> None:
    f = make_fleet(10)
    f.records["new"] = NodeRecord.new("new", at=0)
    f.records["odd"] = NodeRecord.new("odd", at=0)
    d = f.send("new", ev.Registered("joined"), now=1)
    assert f.state("new") is S.BURN_IN
    assert kinds(d) == [ActionKind.TAINT, ActionKind.RUN_CHECKS]
    assert d.actions[1].profile == "burn-in"
    d = f.send("new", ev.ChecksCompleted(passed=True), now=2)
    assert f.state("new") is S.PRODUCTION and kinds(d) == [ActionKind.UNTAINT, ActionKind.UNCORDON]
    f.send("odd", ev.InventoryMismatch("7 GPUs seen, 8 expected"), now=1)
    assert f.state("odd") is S.TRIAGE
    assert f.records["odd"].reason == "7 GPUs seen, 8 expected"


def test_burn_in_failure_and_timeout_go_to_triage() -> None:
    f = make_fleet(1)
    f.records["a"] = NodeRecord.new("a", at=0)
    f.records["b"] = NodeRecord.new("b", at=0)
    f.send("a", ev.Registered(), now=0)
    f.send("a", ev.ChecksCompleted(passed=False, detail="HBM 2.1 TB/s < 3.0"), now=10)
    assert f.state("a") is S.TRIAGE
    f.send("b", ev.Registered(), now=0)
    f.send("b", ev.Tick(), now=4 * 3600)
    assert f.state("b") is S.TRIAGE and "timed out" in f.records["b"].reason


def test_maintenance_round_trip_goes_through_verification() -> None:
    f = make_fleet(10)
    d = f.send("n1", ev.MaintenanceRequested("firmware 550.90"), now=0)
    assert f.state("n1") is S.DRAINING and kinds(d) == [ActionKind.CORDON, ActionKind.DRAIN]
    f.send("n1", ev.DrainCompleted(), now=1)
    assert f.state("n1") is S.MAINTENANCE
    d = f.send("n1", ev.MaintenanceCompleted("done"), now=2)
    assert f.state("n1") is S.VERIFYING
    d = f.send("n1", ev.ChecksCompleted(passed=False), now=3)
    assert f.state("n1") is S.REMEDIATING and d.actions[0].step is Step.GPU_RESET


def test_triage_return_is_verified() -> None:
    f = make_fleet(10)
    f.send("n1", fault("n1", FaultKind.SDC_MISMATCH, at=0, gpu_index=6), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    assert f.state("n1") is S.TRIAGE
    d = f.send("n1", ev.OperatorReturn("GPU 6 reseated"), now=2)
    assert f.state("n1") is S.VERIFYING
    assert ActionKind.RUN_CHECKS in kinds(d)
    f.send("n1", ev.ChecksCompleted(passed=True), now=3)
    assert f.state("n1") is S.PRODUCTION


def test_faults_while_remediating_are_recorded_only() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=0), now=0)
    f.send("n1", ev.DrainCompleted(), now=1)
    d = f.send("n1", xid("n1", 48, at=2), now=2)
    assert f.state("n1") is S.REMEDIATING and not d.actions
    assert len(f.records["n1"].occurrences) == 2


def test_fault_during_burn_in_sends_to_triage() -> None:
    f = make_fleet(1)
    f.records["a"] = NodeRecord.new("a", at=0)
    f.send("a", ev.Registered(), now=0)
    f.send("a", fault("a", FaultKind.IB_PORT_DOWN, at=1, hca="mlx5_3", port=1), now=1)
    assert f.state("a") is S.TRIAGE


def test_unknown_pool_fails_closed() -> None:
    f = make_fleet(10)
    f.records["x"] = replace(NodeRecord.new("x", at=0, state=S.PRODUCTION), pool="ghost")
    d = f.send("x", xid("x", 79, at=0), now=0)
    assert d.hold is Hold.BUDGET_EXHAUSTED
