"""Departure notices in the simulation (dst.notices): a noticed job that leaves is
requeued by the syncer, one that ignores its notice is requeued when the grace ends, one
that finishes its work (exit 0) is not; invariant 17 fires when a syncer forgets the
requeue of a job that left, 18 when it requeues every noticed job that left (the rule
before decision 0279)."""

from __future__ import annotations

import pytest

from gpufleet.domain import departure
from gpufleet.dst.runner import Result, Spec, run
from gpufleet.dst.scenario import Config, Env
from gpufleet.dst.world import World

# pick 3: the fourth idle node (n4), asks for a notice, leaves 4 s after it (exit 75);
# pick 9 (n1 of the three left idle): asks for one and ignores it. A fault on each node 20 s later.
EVENTS = (
    Env(5.0, "job", (3, True, True, 600)),
    Env(6.0, "job", (9, True, True, 600)),
    Env(20.0, "fault", ("n4", "xid79", 0)),
    Env(21.0, "fault", ("n1", "xid79", 0)),
)
# As above, but the second job (pick 6, n1) finishes its work 7 s after its notice (exit 0).
FINISHING = (*EVENTS[:1], Env(6.0, "job", (6, True, True, 600)), *EVENTS[2:])


def _run(seen: dict[str, object], events: tuple[Env, ...] = EVENTS) -> Result:
    def look(world: World) -> None:
        seen["signalled"] = sorted(world.slurm.signalled)
        seen["requeued_finished"] = sorted(world.slurm.requeued_finished)
        seen["running"] = sorted(world.slurm.jobs)
        seen["done"] = sorted(world.slurm.done_noticed)
        seen["rerun"] = sorted(world.slurm.rerun)

    return run(Spec(1, Config(duration=60.0), events=events), inspect=look)


def test_noticed_jobs_are_requeued_once_left_or_at_the_grace() -> None:
    seen: dict[str, object] = {}
    result = _run(seen)
    assert result.violation is None, result.violation
    left, ignored = 1001, 1002  # job ids in the order they started
    assert seen["signalled"] == [left, ignored]
    assert seen["requeued_finished"] == [left]  # left, then requeued
    assert ignored not in seen["running"]  # requeued running, when its grace ended


def test_a_noticed_job_that_finishes_its_work_is_not_requeued() -> None:
    seen: dict[str, object] = {}
    result = _run(seen, FINISHING)
    assert result.violation is None, result.violation
    left, done = 1001, 1002
    assert seen["signalled"] == [left, done]
    assert seen["requeued_finished"] == [left]
    assert seen["done"] == [done] and seen["rerun"] == []  # finished: not run again


def test_invariant_17_catches_a_syncer_that_forgets_a_job_that_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = departure.plan_departure

    def forgets(*args: object, **kwargs: object) -> departure.DeparturePlan:
        plan = real(*args, **kwargs)  # type: ignore[arg-type]
        kept = tuple(r for r in plan.requeue if r.outcome is not departure.Outcome.LEFT)
        return departure.DeparturePlan(
            plan.notice, kept, plan.waiting, plan.unrequeueable, plan.due_at
        )

    monkeypatch.setattr(departure, "plan_departure", forgets)
    monkeypatch.setattr(departure, "after_drain", lambda *a: ((), ()))
    result = _run({})
    assert result.violation is not None and result.violation.invariant == "17"


def test_invariant_18_catches_a_syncer_that_requeues_every_noticed_job_that_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The rule before decision 0279: whatever ended, requeue it.
    monkeypatch.setattr(
        departure,
        "_left",
        lambda job_id, at, ended: departure.Requeue(job_id, departure.Outcome.LEFT, at),
    )
    result = _run({}, FINISHING)
    assert result.violation is not None and result.violation.invariant == "18"
