"""The syncer's departure notices (slurm.departures) with in-memory Slurm and Kubernetes:
recorded on the Node before the signal, requeued once the job left or its grace ended,
carried over a restart; a job without the token keeps the plain requeue."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufleet.clock import ManualClock
from gpufleet.domain import departure, slurm_sync, well_known
from gpufleet.slurm import restapi
from gpufleet.slurm.metrics import SyncerMetrics
from gpufleet.slurm.syncer import Syncer

from ..fakes import FakeSlurm
from .fakes import RecordingKube
from .test_metrics import make, node, value

NOTICES = well_known.ANNOTATION_SLURM_NOTICES
DEPARTED = departure.Ended("FAILED", departure.DEPARTED_EXIT_CODE)


def job(job_id: int, on: str, notice: bool = True) -> slurm_sync.JobView:
    return slurm_sync.JobView(job_id, 1, True, frozenset({on}), wants_notice=notice)


def notices_written(kube: RecordingKube) -> list[str | None]:
    return [
        p["metadata"]["annotations"][NOTICES]
        for _, p in kube.patches
        if NOTICES in (p.get("metadata") or {}).get("annotations", {})
    ]


def run(s: Syncer, name: str) -> None:
    async def go() -> None:
        await s.poll_slurm()
        await s.reconcile(name)

    asyncio.run(go())


def test_a_job_without_the_token_is_requeued_at_once_with_no_signal() -> None:
    slurm = FakeSlurm(["a"])
    slurm.jobs = [job(1, "a", notice=False)]
    kube = RecordingKube()
    s, m = make(slurm, {"a": node("a", "Xid79")}, kube=kube)
    run(s, "a")
    assert slurm.requeued == [1]
    assert not [c for c in slurm.calls if c[0] == "signal"]
    assert notices_written(kube) == []
    assert value(m, "gpufleet_syncer_notices_total") == 0


def noticed() -> tuple[FakeSlurm, RecordingKube, ManualClock, Syncer, SyncerMetrics]:
    """Job 1 on node a, which must be emptied: noticed (grace 30 s)."""
    slurm = FakeSlurm(["a"])
    slurm.jobs = [job(1, "a")]
    kube, clock = RecordingKube(), ManualClock()
    s, m = make(slurm, {"a": node("a", "Xid79")}, kube=kube, clock=clock, notice_grace_s=30)
    run(s, "a")
    assert ("signal", "1", "USR1") in slurm.calls
    return slurm, kube, clock, s, m


def test_noticed_recorded_first_then_requeued_once_it_left() -> None:
    slurm, kube, clock, s, m = noticed()
    assert slurm.requeued == []
    assert notices_written(kube) == [f"1={clock.now():.3f}"]
    assert value(m, "gpufleet_syncer_notices_total") == 1
    run(s, "a")  # still running, within its grace: nothing more
    assert slurm.requeued == [] and value(m, "gpufleet_syncer_notices_total") == 1
    clock.advance(4)
    slurm.jobs = []  # its steps ended, the batch script with them: exit 75
    slurm.ended_jobs = {1: DEPARTED}
    run(s, "a")
    assert slurm.requeued == [1]
    assert value(m, "gpufleet_syncer_notice_seconds_count", outcome="left") == 1
    assert value(m, "gpufleet_syncer_notice_seconds_sum", outcome="left") == 4
    assert notices_written(kube)[-1] is None  # the record is gone with the requeue


@pytest.mark.parametrize(
    "ended",
    [departure.Ended("COMPLETED", 0), departure.Ended("CANCELLED", None), None],
)
def test_a_noticed_job_that_ended_on_its_own_is_not_requeued(
    ended: departure.Ended | None,
) -> None:
    slurm, kube, clock, s, m = noticed()
    clock.advance(3)
    slurm.jobs = []  # its work was done (or its owner cancelled it) within the grace
    slurm.ended_jobs = {} if ended is None else {1: ended}
    run(s, "a")
    clock.advance(60)
    run(s, "a")
    assert slurm.requeued == [] and not [c for c in slurm.calls if c[0] == "requeue"]
    assert value(m, "gpufleet_syncer_notice_seconds_count", outcome="ended") == 1
    assert value(m, "gpufleet_syncer_notice_seconds_count", outcome="left") == 0
    assert notices_written(kube)[-1] is None  # its notice is dropped


def test_a_job_that_ignores_its_notice_is_requeued_when_the_grace_ends() -> None:
    slurm = FakeSlurm(["a"])
    slurm.jobs = [job(1, "a")]
    clock = ManualClock()
    s, m = make(slurm, {"a": node("a", "Xid79")}, clock=clock, notice_grace_s=30)
    run(s, "a")
    clock.advance(29)
    run(s, "a")
    assert slurm.requeued == []
    clock.advance(1)
    run(s, "a")
    assert slurm.requeued == [1]
    assert value(m, "gpufleet_syncer_notice_seconds_count", outcome="grace_expired") == 1
    # Slurm still shows it a moment (COMPLETING): it is not noticed a second time.
    slurm.jobs = [job(1, "a")]
    run(s, "a")
    assert [c for c in slurm.calls if c[0] == "signal"] == [("signal", "1", "USR1")]
    assert value(m, "gpufleet_syncer_notices_total") == 1


def test_a_restarted_syncer_sends_the_notice_again_and_keeps_the_deadline() -> None:
    slurm = FakeSlurm(["a"])
    slurm.jobs = [job(1, "a")]
    clock = ManualClock()
    first, _ = make(slurm, {"a": node("a", "Xid79")}, clock=clock, notice_grace_s=30)
    run(first, "a")
    record = first.nodes["a"]["metadata"]["annotations"][NOTICES]
    # Killed here; a new syncer reads the Node (the record on it) 10 s later.
    clock.advance(10)
    slurm.calls.clear()
    again, m = make(
        slurm, {"a": node("a", "Xid79", **{NOTICES: record})}, clock=clock, notice_grace_s=30
    )
    run(again, "a")
    assert ("signal", "1", "USR1") in slurm.calls and slurm.requeued == []
    clock.advance(20)  # 30 s after the first notice, not after the second
    run(again, "a")
    assert slurm.requeued == [1]
    assert value(m, "gpufleet_syncer_notice_seconds_sum", outcome="grace_expired") == 30


def test_a_job_that_left_while_the_syncer_was_away_is_requeued_after_the_restart() -> None:
    slurm = FakeSlurm(["a"])
    record = {NOTICES: "1=999990.000"}
    slurm.ended_jobs = {1: DEPARTED}
    s, _ = make(slurm, {"a": node("a", "Xid79", **record)}, notice_grace_s=30)
    run(s, "a")
    assert slurm.requeued == [1]


def test_a_noticed_job_that_left_is_requeued_even_once_the_node_is_back() -> None:
    slurm = FakeSlurm(["a"])
    slurm.views["a"] = slurm_sync.SlurmView(
        "idle", frozenset({"DRAIN"}), "gpufleet: GpuProblem Xid79"
    )
    kube = RecordingKube()
    clock = ManualClock()
    now = clock.now()
    record = f"1={now - 10:.3f},2={now - 10:.3f},3={now - 40:.3f}"
    healthy: dict[str, Any] = node("a", None, **{NOTICES: record})
    slurm.jobs = [job(2, "a"), job(3, "a")]
    slurm.ended_jobs = {1: DEPARTED}
    s, _ = make(slurm, {"a": healthy}, kube=kube, clock=clock, notice_grace_s=30)
    run(s, "a")  # undrains; 1 left (owed its requeue); 2 within its grace; 3 past it
    assert slurm.requeued == [1]
    assert notices_written(kube)[-1] == f"2={now - 10:.3f}"
    clock.advance(5)
    slurm.jobs = [job(3, "a")]  # 2 left after all
    slurm.ended_jobs = {1: DEPARTED, 2: DEPARTED}
    run(s, "a")
    assert slurm.requeued == [1, 2]
    assert notices_written(kube)[-1] is None


def test_dry_run_sends_nothing_and_records_nothing() -> None:
    slurm = FakeSlurm(["a"])
    slurm.views["a"] = slurm_sync.SlurmView(
        "idle", frozenset({"DRAIN"}), "gpufleet: GpuProblem Xid79"
    )
    slurm.jobs = [job(1, "a")]
    kube = RecordingKube()
    s, _ = make(slurm, {"a": node("a", "Xid79")}, kube=kube, dry_run=True)
    run(s, "a")
    assert not [c for c in slurm.calls if c[0] in ("signal", "requeue")]
    assert notices_written(kube) == []


def test_the_jobs_codec_reads_the_token_from_the_comment() -> None:
    raw = {"job_id": 5, "job_state": ["RUNNING"], "nodes": "a", "requeue": True}
    assert not restapi.job_view(raw).wants_notice
    assert restapi.job_view({**raw, "comment": "team-a gpufleet.io/notice"}).wants_notice
    assert not restapi.job_view({**raw, "comment": "gpufleet.io/notices"}).wants_notice


@pytest.mark.parametrize(
    ("exit_code", "code"),
    [
        (75 << 8, 75),  # v0.0.38 (Slurm 22.05): the wait status
        (0, 0),
        (9, None),  # killed by SIGKILL
        ({"status": ["FAILED"], "return_code": {"set": True, "number": 75}}, 75),  # v0.0.40+
        ({"status": "FAILED", "return_code": 75}, 75),  # v0.0.39
        ({"status": ["SIGNALED"], "return_code": {"set": True, "number": 0}}, None),
        (None, None),
    ],
)
def test_the_jobs_codec_reads_an_ended_jobs_exit_code_in_each_shape(
    exit_code: object, code: int | None
) -> None:
    raw = {"job_id": 5, "job_state": "FAILED", "nodes": "a", "exit_code": exit_code}
    assert restapi.ended_job(raw) == (5, departure.Ended("FAILED", code))


def test_the_jobs_codec_keeps_only_the_ended_jobs_that_asked_for_a_notice() -> None:
    base = {"nodes": "a", "requeue": True, "comment": "gpufleet.io/notice"}
    entries = [
        restapi._job_entry({**base, "job_id": 1, "job_state": ["RUNNING"]}),
        restapi._job_entry({**base, "job_id": 2, "job_state": ["FAILED"], "exit_code": 19200}),
        restapi._job_entry({**base, "job_id": 3, "job_state": ["COMPLETED"], "comment": ""}),
        restapi._job_entry({**base, "job_id": 4, "job_state": ["PENDING"], "exit_code": 19200}),
    ]
    running, ended = restapi.split_jobs([e for e in entries if e is not None])
    assert [j.job_id for j in running] == [1]
    assert ended == {2: DEPARTED} and ended[2].departed
