"""The departure notice decision (domain.departure): who is told, who is requeued, when."""

from __future__ import annotations

import pytest

from gpufleet.domain import departure as dp
from gpufleet.domain.departure import Outcome, Requeue
from gpufleet.domain.slurm_sync import JobView

GRACE = 30.0
DEPARTED = dp.Ended("FAILED", dp.DEPARTED_EXIT_CODE)


def job(i: int, notice: bool = True, requeueable: bool = True) -> JobView:
    return JobView(i, 1, requeueable, frozenset({"n1"}), wants_notice=notice)


@pytest.mark.parametrize(
    ("comment", "wants"),
    [
        ("gpufleet.io/notice", True),
        ("team-a gpufleet.io/notice", True),
        ("x,gpufleet.io/notice;y", True),
        ("gpufleet.io/notices", False),
        ("my-gpufleet.io/notice", False),
        ("", False),
        (None, False),
    ],
)
def test_the_token_is_a_word_of_the_comment(comment: str | None, wants: bool) -> None:
    assert dp.wants_notice(comment) is wants


def test_a_job_without_the_token_is_requeued_at_once_as_before() -> None:
    plan = dp.plan_departure([job(1, notice=False)], {}, set(), 100.0, GRACE, {}, seen_at=100.0)
    assert plan.requeue == (Requeue(1),) and plan.notice == () and plan.waiting == ()


def test_a_job_with_the_token_is_noticed_then_waits_for_its_grace() -> None:
    first = dp.plan_departure([job(1)], {}, set(), 100.0, GRACE, {}, seen_at=100.0)
    assert first.notice == (1,) and first.requeue == () and first.due_at == 100.0 + GRACE
    waiting = dp.plan_departure([job(1)], {1: 100.0}, {1}, 129.9, GRACE, {}, seen_at=129.9)
    assert waiting.notice == () and waiting.requeue == () and waiting.waiting == (1,)


def test_a_grace_ends_only_for_a_read_begun_after_it() -> None:
    """The job was running in a read taken before its grace ended: it may have finished its
    work since (Slurm would run it again), so it waits for a newer read."""
    stale = dp.plan_departure([job(1)], {1: 100.0}, {1}, 140.0, GRACE, {}, seen_at=129.0)
    assert stale.requeue == () and stale.waiting == (1,) and stale.notice == ()
    fresh = dp.plan_departure([job(1)], {1: 100.0}, {1}, 140.0, GRACE, {}, seen_at=131.0)
    assert fresh.requeue == (Requeue(1, Outcome.GRACE_EXPIRED, 100.0),)


def test_a_job_that_left_is_requeued_before_its_grace() -> None:
    plan = dp.plan_departure([], {1: 100.0}, {1}, 103.0, GRACE, {1: DEPARTED}, seen_at=103.0)
    assert plan.requeue == (Requeue(1, Outcome.LEFT, 100.0),)
    assert plan.requeue[0].requeues


@pytest.mark.parametrize(
    "ended",
    [
        dp.Ended("COMPLETED", 0),
        dp.Ended("CANCELLED", None),
        dp.Ended("CANCELLED", 0),
        dp.Ended("FAILED", 1),
        dp.Ended("FAILED", None),
        dp.Ended("NODE_FAIL", 0),
        dp.Ended("TIMEOUT", None),
        dp.Ended("OUT_OF_MEMORY", 0),
        dp.Ended("COMPLETED", dp.DEPARTED_EXIT_CODE),  # not FAILED: not a departure
        None,  # Slurm no longer has its record (purged after MinJobAge)
    ],
)
def test_a_noticed_job_that_ended_any_other_way_is_dropped_not_requeued(
    ended: dp.Ended | None,
) -> None:
    records = {} if ended is None else {1: ended}
    plan = dp.plan_departure([], {1: 100.0}, {1}, 103.0, GRACE, records, seen_at=103.0)
    assert plan.requeue == (Requeue(1, Outcome.ENDED, 100.0),)
    assert not plan.requeue[0].requeues
    late = dp.plan_departure([], {1: 100.0}, set(), 500.0, GRACE, records, seen_at=500.0)
    assert late.requeue == (Requeue(1, Outcome.ENDED, 100.0),)
    owed, keep = dp.after_drain([], {1: 100.0}, 103.0, GRACE, records)
    assert owed == (Requeue(1, Outcome.ENDED, 100.0),) and keep == ()


def test_a_job_that_departed_while_the_syncer_was_away_is_requeued_after_the_restart() -> None:
    # Nothing signalled by this process, the grace long over: the record says it departed.
    plan = dp.plan_departure([], {1: 100.0}, set(), 500.0, GRACE, {1: DEPARTED}, seen_at=500.0)
    assert plan.requeue == (Requeue(1, Outcome.LEFT, 100.0),) and plan.notice == ()


def test_a_job_that_ignores_its_notice_is_requeued_when_the_grace_ends() -> None:
    plan = dp.plan_departure([job(1)], {1: 100.0}, {1}, 130.0, GRACE, {}, seen_at=130.0)
    assert plan.requeue == (Requeue(1, Outcome.GRACE_EXPIRED, 100.0),) and plan.notice == ()


def test_after_a_restart_the_notice_is_sent_again_and_the_deadline_kept() -> None:
    # The record says job 1 was noticed at 100; this process never signalled it.
    plan = dp.plan_departure([job(1)], {1: 100.0}, set(), 110.0, GRACE, {}, seen_at=110.0)
    assert plan.notice == (1,) and plan.requeue == () and plan.due_at == 130.0
    late = dp.plan_departure([job(1)], {1: 100.0}, set(), 131.0, GRACE, {}, seen_at=131.0)
    assert late.notice == () and late.requeue == (Requeue(1, Outcome.GRACE_EXPIRED, 100.0),)


def test_no_requeue_jobs_are_reported_never_noticed() -> None:
    plan = dp.plan_departure(
        [job(2, requeueable=False)], {}, set(), 100.0, GRACE, {}, seen_at=100.0
    )
    assert plan.unrequeueable == (2,) and plan.notice == () and plan.requeue == ()


def test_grace_zero_turns_notices_off() -> None:
    plan = dp.plan_departure([job(1)], {}, set(), 100.0, 0.0, {}, seen_at=100.0)
    assert plan.requeue == (Requeue(1),) and plan.notice == ()


def test_mixed_jobs_each_on_their_own_path() -> None:
    jobs = [job(3, notice=False), job(1), job(2, requeueable=False)]
    plan = dp.plan_departure(jobs, {4: 90.0}, {4}, 100.0, GRACE, {4: DEPARTED}, seen_at=100.0)
    assert plan.notice == (1,)
    assert plan.requeue == (Requeue(3), Requeue(4, Outcome.LEFT, 90.0))
    assert plan.unrequeueable == (2,)


def test_after_the_drain_goes_the_jobs_that_left_are_still_owed_their_requeue() -> None:
    jobs = [job(1), job(3)]
    notices = {1: 100.0, 2: 101.0, 3: 60.0}
    owed, keep = dp.after_drain(jobs, notices, 120.0, GRACE, {2: DEPARTED})
    assert owed == (Requeue(2, Outcome.LEFT, 101.0),)
    assert keep == (1,)  # within its grace: it may yet leave; 3 is past it: forgotten


def test_the_record_round_trips_and_drops_what_does_not_parse() -> None:
    text = dp.format_notices({7: 100.5, 3: 1.0})
    assert text == "3=1.000,7=100.500"
    assert dp.parse_notices(text) == {3: 1.0, 7: 100.5}
    assert dp.parse_notices("x=1,5=y,6=2,junk") == {6: 2.0}
    assert dp.format_notices({}) is None and dp.parse_notices(None) == {}
