"""Lemon scores: classes, weights, decay, per-GPU scores, and what decide() does with them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import events as ev
from gpufleet.domain import lemon
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.lemon import FaultClass, LemonScore, LemonWeights
from gpufleet.domain.policy import default_policy
from gpufleet.domain.records import record_from_json, record_to_json
from gpufleet.domain.states import NodeState

from .conftest import fault, make_fleet, xid

S = NodeState
DAY = 86400.0
HL = 14 * DAY


def _xid(code: int, gpu: int | None = 0) -> FaultEvent:
    return FaultEvent(FaultKind.XID, "n", at=0.0, xid=code, evidence=Evidence(gpu_index=gpu))


@pytest.mark.parametrize(
    ("event", "cls"),
    [
        (_xid(79), FaultClass.HARDWARE),  # fallen off the bus
        (_xid(48), FaultClass.HARDWARE),  # double-bit ECC
        (_xid(13), FaultClass.APPLICATION),  # graphics engine exception
        (_xid(74), FaultClass.LINK),  # NVLink error
        (_xid(999), FaultClass.INFORMATIONAL),  # not in the catalogue
        (FaultEvent(FaultKind.IB_LINK_FLAP, "n", at=0.0), FaultClass.LINK),
        (FaultEvent(FaultKind.THERMAL_THROTTLE, "n", at=0.0), FaultClass.ENVIRONMENT),
        (FaultEvent(FaultKind.STRAGGLER, "n", at=0.0), FaultClass.PERFORMANCE),
        (FaultEvent(FaultKind.KERNEL_SOFT_LOCKUP, "n", at=0.0), FaultClass.SOFTWARE),
        (FaultEvent(FaultKind.SDC_MISMATCH, "n", at=0.0), FaultClass.HARDWARE),
    ],
)
def test_fault_class(event: FaultEvent, cls: FaultClass) -> None:
    assert lemon.fault_class(event) is cls


def test_every_fault_kind_has_a_class() -> None:
    for kind in FaultKind:
        if kind is not FaultKind.XID:
            assert isinstance(lemon.fault_class(FaultEvent(kind, "n", at=0.0)), FaultClass)


def test_weights_cover_every_class() -> None:
    w = LemonWeights()
    assert {c: w.of(c) for c in FaultClass}[FaultClass.HARDWARE] == 1.0
    assert w.of(FaultClass.APPLICATION) == 0.0


def test_score_halves_every_half_life_and_adds_per_gpu() -> None:
    s = lemon.add(None, weight=1.0, scope="gpu3", now=0.0, half_life_seconds=HL)
    s = lemon.add(s, weight=0.5, scope="mlx5_0/1", now=HL, half_life_seconds=HL)
    assert s.node == pytest.approx(1.0)  # 0.5 decayed + 0.5 new
    assert s.gpus == {"gpu3": pytest.approx(0.5)}  # the link fault is not a GPU's
    later = s.now(2 * HL)
    assert later.node == pytest.approx(0.5) and later.gpus["gpu3"] == pytest.approx(0.25)


def test_a_gpu_that_decayed_to_nothing_is_dropped() -> None:
    s = lemon.add(None, weight=1.0, scope="gpu1", now=0.0, half_life_seconds=DAY)
    assert s.now(10 * DAY).gpus == {}  # 2**-10 < 0.01


def test_a_new_half_life_applies_forward_only() -> None:
    s = lemon.add(None, weight=1.0, scope="node", now=0.0, half_life_seconds=DAY)
    s = lemon.add(s, weight=0.0, scope="node", now=DAY, half_life_seconds=10 * DAY)
    assert s.node == pytest.approx(0.5) and s.half_life_seconds == 10 * DAY


@given(
    st.lists(
        st.tuples(st.floats(0, 5), st.floats(0, 30 * DAY), st.integers(0, 7)),
        min_size=1,
        max_size=20,
    )
)
def test_incremental_score_equals_the_sum_of_decayed_weights(
    faults: list[tuple[float, float, int]],
) -> None:
    faults = sorted(faults, key=lambda f: f[1])
    s: LemonScore | None = None
    for w, t, g in faults:
        s = lemon.add(s, weight=w, scope=f"gpu{g}", now=t, half_life_seconds=HL)
    assert s is not None
    end = faults[-1][1]
    want = sum(w * 2 ** (-(end - t) / HL) for w, t, _ in faults)
    assert math.isclose(s.node, want, rel_tol=1e-9, abs_tol=1e-9)
    assert s.node >= max(s.gpus.values(), default=0.0) - 1e-9


def test_judge_names_the_node_or_the_gpu() -> None:
    s = lemon.add(None, weight=2.0, scope="gpu5", now=0.0, half_life_seconds=HL)
    v = lemon.judge(s, now=0.0, threshold=2.5, gpu_threshold=1.8)
    assert v.lemon and "gpu5" in v.why
    v = lemon.judge(s, now=HL, threshold=2.5, gpu_threshold=1.8)
    assert not v.lemon  # decayed to 1.0
    assert not lemon.judge(None, now=0.0, threshold=2.5, gpu_threshold=1.8).lemon


def test_score_survives_the_stored_record() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=5.0, gpu=2), now=5.0)
    rec = f.records["n1"]
    assert rec.lemon is not None and rec.lemon.gpus == {"gpu2": 1.0}
    assert record_from_json(record_to_json(rec)) == rec


def test_application_xids_restarting_the_job_add_nothing() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 13, at=0.0), now=0.0)
    assert f.state("n1") is S.PRODUCTION
    assert f.records["n1"].lemon is not None and f.records["n1"].lemon.node == 0.0


def test_application_xids_that_take_the_node_out_count_as_hardware() -> None:
    f = make_fleet(10)
    for t in (0.0, 10.0, 20.0):  # three XID 13 on GPU 0 within an hour -> gpu-reset
        f.send("n1", xid("n1", 13, at=t), now=t)
    assert f.state("n1") is S.DRAINING
    assert f.records["n1"].lemon.gpus["gpu0"] == pytest.approx(1.0, rel=1e-3)


def test_logged_faults_in_production_count_with_their_class_weight() -> None:
    f = make_fleet(10)
    f.send("n1", fault("n1", FaultKind.THERMAL_THROTTLE, at=0.0), now=0.0)
    assert f.state("n1") is S.PRODUCTION
    assert f.records["n1"].lemon.node == pytest.approx(0.1)
    # The same report again (same time) is not counted twice.
    f.send("n1", fault("n1", FaultKind.THERMAL_THROTTLE, at=0.0), now=1.0)
    assert f.records["n1"].lemon.node == pytest.approx(0.1, rel=1e-3)


def test_faults_while_the_node_is_out_belong_to_its_incident() -> None:
    f = make_fleet(10)
    f.send("n1", xid("n1", 79, at=0.0), now=0.0)
    f.send("n1", xid("n1", 48, at=1.0, gpu=1), now=1.0)
    assert f.records["n1"].lemon.node == pytest.approx(1.0, rel=1e-3)


def test_a_held_fault_is_counted_once_when_it_is_acted_on() -> None:
    f = make_fleet(10)  # 10% of 10: one node may be out
    f.send("n0", xid("n0", 79, at=0.0), now=0.0)
    f.send("n1", xid("n1", 79, at=10.0), now=10.0)
    assert f.state("n1") is S.PRODUCTION and f.records["n1"].lemon is None
    f.send("n1", ev.Tick(), now=20.0)  # still held
    f.send("n0", ev.OperatorTriage("a person looks"), now=30.0)
    f.send("n0", ev.DrainCompleted(), now=31.0)  # n0 in triage: no longer counted as out
    f.send("n1", ev.Tick(), now=40.0)
    assert f.state("n1") is S.DRAINING
    assert f.records["n1"].lemon.node == pytest.approx(1.0, rel=1e-3)


def test_a_lemon_plan_of_rma_is_followed_and_replacement_resets_the_score() -> None:
    data = default_policy().model_dump(by_alias=True, mode="json")
    data["lemon"]["then"] = "rma"
    policy = type(default_policy()).model_validate(data)
    f = make_fleet(10, policy)
    for i, t in enumerate((0.0, DAY)):
        f.send("n1", xid("n1", 79, at=t, gpu=i), now=t)
        f.send("n1", ev.DrainCompleted(), now=t + 1)
        f.send("n1", ev.StepCompleted(Step.REBOOT, succeeded=True), now=t + 2)
        f.send("n1", ev.ChecksCompleted(passed=True), now=t + 3)
    d = f.send("n1", xid("n1", 79, at=2 * DAY, gpu=2), now=2 * DAY)
    assert any("-> rma instead of another repair" in r for r in d.reasons)
    f.send("n1", ev.DrainCompleted(), now=2 * DAY + 1)
    assert f.state("n1") is S.RMA
    f.send("n1", ev.HardwareReplaced("new baseboard"), now=3 * DAY)
    assert f.records["n1"].lemon is None
