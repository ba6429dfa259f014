"""The syncer's departure notices (slurm.departures) with in-memory Slurm and Kubernetes:
recorded on the Node before the signal, requeued once the job left or its grace ended,
carried over a restart; a job without the token keeps the plain requeue."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.clock import ManualClock
from gpufleet.domain import slurm_sync, well_known
from gpufleet.slurm import restapi
from gpufleet.slurm.syncer import Syncer

from ..fakes import FakeSlurm
from .fakes import RecordingKube
from .test_metrics import make, node, value

NOTICES = well_known.ANNOTATION_SLURM_NOTICES


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


def test_noticed_recorded_first_then_requeued_once_it_left() -> None:
    slurm = FakeSlurm(["a"])
    slurm.jobs = [job(1, "a")]
    kube, clock = RecordingKube(), ManualClock()
    s, m = make(slurm, {"a": node("a", "Xid79")}, kube=kube, clock=clock, notice_grace_s=30)
    run(s, "a")
    assert ("signal", "1", "USR1") in slurm.calls
    assert slurm.requeued == []
    assert notices_written(kube) == [f"1={clock.now():.3f}"]
    assert value(m, "gpufleet_syncer_notices_total") == 1
    run(s, "a")  # still running, within its grace: nothing more
    assert slurm.requeued == [] and value(m, "gpufleet_syncer_notices_total") == 1
    clock.advance(4)
    slurm.jobs = []  # its steps ended, the batch script with them
    run(s, "a")
    assert slurm.requeued == [1]
    assert value(m, "gpufleet_syncer_notice_seconds_count", outcome="left") == 1
    assert value(m, "gpufleet_syncer_notice_seconds_sum", outcome="left") == 4
    assert notices_written(kube)[-1] is None  # the record is gone with the requeue


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
    s, _ = make(slurm, {"a": healthy}, kube=kube, clock=clock, notice_grace_s=30)
    run(s, "a")  # undrains; 1 left (owed its requeue); 2 within its grace; 3 past it
    assert slurm.requeued == [1]
    assert notices_written(kube)[-1] == f"2={now - 10:.3f}"
    clock.advance(5)
    slurm.jobs = [job(3, "a")]  # 2 left after all
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
