"""Debounce and windows: conditions neither flap nor hide a fault."""

from __future__ import annotations

from gpufleet.domain.debounce import ConditionState, Observation, Status, clears_at, observe
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.policy import Detection

DET = Detection(raise_after_seconds=5, clear_after_seconds=30)
PORT = FaultEvent(FaultKind.IB_PORT_DOWN, "n", 0.0, evidence=Evidence(hca="mlx5_0", port=1))
XID = FaultEvent(FaultKind.XID, "n", 0.0, xid=79, evidence=Evidence(gpu_index=3))


def run(seq: list[tuple[float, tuple[FaultEvent, ...], tuple[FaultEvent, ...]]]) -> list[Status]:
    s = ConditionState()
    out = []
    for at, state, instant in seq:
        s = observe(s, Observation(at, state, instant), DET)
        out.append(s.status)
    return out


def test_a_state_problem_must_persist_before_it_is_raised() -> None:
    P, H = Status.PROBLEM, Status.HEALTHY
    statuses = run([(0, (), ()), (1, (PORT,), ()), (3, (PORT,), ()), (6, (PORT,), ())])
    assert statuses == [H, H, H, P]


def test_a_port_that_bounces_once_never_raises() -> None:
    statuses = run([(0, (), ()), (1, (PORT,), ()), (2, (), ()), (4, (PORT,), ()), (5, (), ())])
    assert Status.PROBLEM not in statuses


def test_an_instant_fault_raises_at_once_and_holds_for_the_clear_window() -> None:
    s = observe(ConditionState(), Observation(0, (), ()), DET)
    s = observe(s, Observation(10, (), (XID,)), DET)
    assert s.problem and s.changed_at == 10 and s.faults == (XID,)
    assert clears_at(s, DET) == 40
    for t in (11, 20, 39.9):
        s = observe(s, Observation(t, (), ()), DET)
        assert s.problem, t
    s = observe(s, Observation(40, (), ()), DET)
    assert s.status is Status.HEALTHY and s.changed_at == 40


def test_intermittent_fault_keeps_the_condition_up_without_new_transitions() -> None:
    s = observe(ConditionState(), Observation(0, (), (XID,)), DET)
    for t in range(1, 100):
        s = observe(s, Observation(t, (), (XID,) if t % 20 == 0 else ()), DET)
        assert s.problem
    assert s.changed_at == 0


def test_unreadable_source_is_unknown_never_a_problem() -> None:
    s = observe(ConditionState(), Observation(0, readable=False, unreadable_reason="no NVML"), DET)
    assert s.status is Status.UNKNOWN and s.note == "no NVML"
    s = observe(s, Observation(1, (), ()), DET)
    assert s.status is Status.HEALTHY


def test_raised_condition_stays_raised_while_the_source_goes_dark() -> None:
    s = observe(ConditionState(), Observation(0, (), (XID,)), DET)
    s = observe(s, Observation(5, readable=False), DET)
    assert s.problem
