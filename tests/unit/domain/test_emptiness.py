"""A node is disrupted only when Kubernetes and Slurm agree it is empty (domain.emptiness)."""

from __future__ import annotations

from gpufleet.domain.emptiness import (
    Probe,
    SlurmWork,
    disruptive_work,
    is_slurm_node,
    ready_to_disrupt,
    work_report,
)
from gpufleet.domain.policy import SlurmSilence, SlurmWait

OPENED = 1000.0


def ready(work: SlurmWork | None, **kw: object) -> tuple[bool, str]:
    args: dict[str, object] = {
        "pods_left": 0,
        "slurm_node": True,
        "work": work,
        "incident_opened_at": OPENED,
        "slurm_silent_for": 0.0,
        "silent_limit": 300.0,
        "if_silent": SlurmSilence.WAIT,
    }
    args.update(kw)
    r = ready_to_disrupt(**args)  # type: ignore[arg-type]
    return r.ready, r.why


def test_report_round_trips_and_bad_text_is_no_report() -> None:
    w = work_report("idle+DRAIN", [12, 3], OPENED, 5.5)
    back = SlurmWork.from_annotation(w.to_annotation())
    assert back == w and back.jobs == ("12", "3")
    for bad in (None, "", "{", "[]", '{"jobs": []}', '{"state": 3}', '{"state":"idle","jobs":"1"}'):
        assert SlurmWork.from_annotation(bad) is None


def test_only_drained_and_idle_is_empty() -> None:
    assert SlurmWork("idle+DRAIN").empty
    assert SlurmWork("down+DRAIN+NOT_RESPONDING").empty
    assert not SlurmWork("allocated+DRAIN").empty  # DRAINING: a job still runs
    assert not SlurmWork("mixed+DRAIN").empty
    assert not SlurmWork("idle+COMPLETING+DRAIN").empty  # the epilog still runs
    assert not SlurmWork("idle+DRAIN", jobs=("7",)).empty
    assert not SlurmWork("idle").empty  # not drained: a job may start any moment


def test_kubernetes_pods_alone_decide_for_a_node_outside_slurm() -> None:
    assert ready(None, slurm_node=False)[0]
    ok, why = ready(None, slurm_node=False, pods_left=2)
    assert not ok and "2 pod" in why


def test_slurm_node_waits_for_slurm_to_confirm() -> None:
    ok, why = ready(None)
    assert not ok and "failing closed" in why
    ok, why = ready(SlurmWork("allocated+DRAIN", jobs=("41",), incident=OPENED))
    assert not ok and "41" in why
    assert not ready(SlurmWork("idle", incident=OPENED))[0]
    assert ready(SlurmWork("idle+DRAIN", incident=OPENED))[0]


def test_a_report_for_another_incident_does_not_count() -> None:
    assert not ready(SlurmWork("idle+DRAIN", incident=OPENED - 50))[0]
    assert not ready(SlurmWork("idle+DRAIN", incident=None))[0]


def test_silence_proceeds_only_when_the_rule_says_so_and_never_over_running_jobs() -> None:
    assert not ready(None, slurm_silent_for=10_000)[0]
    assert not ready(None, slurm_silent_for=100, if_silent=SlurmSilence.PROCEED)[0]
    ok, why = ready(None, slurm_silent_for=400, if_silent=SlurmSilence.PROCEED)
    assert ok and "silent" in why
    busy = SlurmWork("allocated+DRAIN", jobs=("9",), incident=OPENED)
    assert not ready(busy, slurm_silent_for=10_000, if_silent=SlurmSilence.PROCEED)[0]


def test_a_node_is_not_slurms_only_when_the_policy_or_the_syncer_says_so() -> None:
    # Defect 7: marks are not needed, and their absence proves nothing (no label, no taint,
    # no report is still a node Slurm may run jobs on: an external Slurm, holdTaint false).
    absent = SlurmWork("absent", incident=OPENED)
    assert is_slurm_node(None, SlurmWait.AUTO)
    assert is_slurm_node(SlurmWork("idle"), SlurmWait.AUTO)
    assert not is_slurm_node(absent, SlurmWait.AUTO)
    assert is_slurm_node(absent, SlurmWait.ALWAYS)
    assert not is_slurm_node(None, SlurmWait.NEVER)
    assert absent.absent and not absent.empty


def test_an_unmarked_node_without_a_report_waits_for_slurm() -> None:
    ok, why = ready(None, slurm_silent_for=10_000)
    assert not ok and "drain.slurm: never" in why


def test_the_probe_and_its_answer_round_trip() -> None:
    probe = Probe("ab12", 10.5, OPENED)
    assert Probe.from_annotation(probe.to_annotation()) == probe
    answer = work_report("idle+DRAIN", [], OPENED, 11.0, probe="ab12")
    assert SlurmWork.from_annotation(answer.to_annotation()) == answer
    for bad in ("", "{}", '{"id": 3, "at": 1}', '{"id": "", "at": 1}', "[1]"):
        assert Probe.from_annotation(bad) is None
    assert SlurmWork.from_annotation('{"state": "idle", "jobs": [], "probe": 7}') is None


def test_disruptive_work_fails_closed() -> None:
    assert disruptive_work(0, None, False) is None
    assert disruptive_work(1, None, False) is not None
    assert disruptive_work(0, SlurmWork("allocated", jobs=("3",)), False) is not None
    assert disruptive_work(0, None, None) == "GPU processes could not be read"
    assert disruptive_work(0, None, True) is not None
