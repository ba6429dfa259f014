"""Departure notices in the simulation (dst.notices): a noticed job that leaves is
requeued by the syncer, one that ignores its notice is requeued when the grace ends,
and invariant 17 fires when a syncer forgets the requeue of a job that left."""

from __future__ import annotations

import pytest

from gpufleet.domain import departure
from gpufleet.dst.runner import Result, Spec, run
from gpufleet.dst.scenario import Config, Env
from gpufleet.dst.world import World

# pick 3: the fourth idle node (n4), asks for a notice, leaves 4 s after it;
# pick 9 (n1 of the three left idle): asks for one and ignores it. A fault on each node 20 s later.
EVENTS = (
    Env(5.0, "job", (3, True, True, 600)),
    Env(6.0, "job", (9, True, True, 600)),
    Env(20.0, "fault", ("n4", "xid79", 0)),
    Env(21.0, "fault", ("n1", "xid79", 0)),
)


def _run(seen: dict[str, object]) -> Result:
    def look(world: World) -> None:
        seen["signalled"] = sorted(world.slurm.signalled)
        seen["requeued_finished"] = sorted(world.slurm.requeued_finished)
        seen["running"] = sorted(world.slurm.jobs)

    return run(Spec(1, Config(duration=60.0), events=EVENTS), inspect=look)


def test_noticed_jobs_are_requeued_once_left_or_at_the_grace() -> None:
    seen: dict[str, object] = {}
    result = _run(seen)
    assert result.violation is None, result.violation
    left, ignored = 1001, 1002  # job ids in the order they started
    assert seen["signalled"] == [left, ignored]
    assert seen["requeued_finished"] == [left]  # left, then requeued
    assert ignored not in seen["running"]  # requeued running, when its grace ended


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
