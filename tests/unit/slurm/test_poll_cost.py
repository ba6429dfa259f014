"""What a Slurm poll costs at rest: after a full pass, a poll reconciles only nodes whose
Node, Slurm view or jobs changed and those not at rest (their reports are time-driven);
every node again each ``full_pass_s``; a slow poll stretches the pause after it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from gpufleet.clock import ManualClock
from gpufleet.domain import slurm_sync
from gpufleet.slurm.syncer import Syncer, SyncSettings, poll_pause

from ..fakes import FakeSlurm
from .fakes import RecordingKube
from .test_write_batches import names, node


def make(n: int, clock: ManualClock) -> tuple[Syncer, FakeSlurm]:
    all_ = names(n)
    slurm = FakeSlurm(all_)
    s = Syncer(
        kube=RecordingKube(),
        rest=slurm,
        scontrol=slurm,
        settings=SyncSettings(hold_taint=False, full_pass_s=60.0),
        clock=clock,
    )
    s.nodes = {x: node(x) for x in all_}
    for i, x in enumerate(all_):
        s.nodes[x]["metadata"]["resourceVersion"] = str(i)
    s.slurm = dict(slurm.views)
    s.jobs = []
    return s, slurm


def test_a_poll_at_rest_reconciles_only_what_changed_and_what_is_not_at_rest() -> None:
    clock = ManualClock()
    s, _ = make(100, clock)
    every = [x for x in s.nodes if s.managed(x)]
    assert s.due_for_pass(every) == every  # the first pass is full
    clock.advance(1)
    assert s.due_for_pass(every) == []  # nothing changed: nothing to do
    # A Node changed, a Slurm view changed, a job started, a node went out of service.
    a, b, c, d = every[:4]
    s.nodes[a]["metadata"]["resourceVersion"] = "new"
    assert s.slurm is not None
    s.slurm[b] = replace(s.slurm[b], state="allocated")
    s.jobs = [slurm_sync.JobView(job_id=7, priority=1, requeueable=True, nodes=frozenset({c}))]
    s.nodes[d] = node(d, "Xid79", state="draining")
    s.nodes[d]["metadata"]["resourceVersion"] = "out"
    s.view_changed()
    clock.advance(1)
    assert sorted(s.due_for_pass(every)) == sorted([a, b, c, d])
    # Next poll: the changed ones are at rest again; the one out of service stays due
    # (its Slurm work report is rewritten on a heartbeat).
    clock.advance(1)
    assert s.due_for_pass(every) == [d]
    # A not-responding node stays due while its report waits for the grace period;
    # once reported (the grace passed), it is at rest like any other.
    s.slurm[b] = replace(s.slurm[b], flags=frozenset({"NOT_RESPONDING"}))
    s.view_changed()
    clock.advance(1)
    assert sorted(s.due_for_pass(every)) == sorted([b, d])
    asyncio.run(s.reconcile(b))  # the poll's reconcile: the grace starts
    clock.advance(1)
    assert sorted(s.due_for_pass(every)) == sorted([b, d])
    clock.advance(s.settings.not_responding_grace_s)
    asyncio.run(s.reconcile(b))  # reported now
    assert sorted(s.due_for_pass(every)) == sorted([b, d])
    clock.advance(1)
    assert s.due_for_pass(every) == [d]
    # Down and not responding (a node whose slurmd is gone) is reported at once: at rest.
    s.slurm[b] = replace(s.slurm[b], state="down", flags=frozenset({"NOT_RESPONDING"}))
    s.view_changed()
    clock.advance(1)
    assert sorted(s.due_for_pass(every)) == sorted([b, d])
    clock.advance(1)
    assert s.due_for_pass(every) == [d]
    # Every full_pass_s, every node.
    clock.advance(60)
    assert s.due_for_pass(every) == every


def test_the_work_report_still_follows_the_jobs_index() -> None:
    clock = ManualClock()
    s, _ = make(3, clock)
    job = slurm_sync.JobView(job_id=9, priority=1, requeueable=True, nodes=frozenset(names(2)))
    s.jobs = [job]
    assert [j.job_id for j in s.jobs_on(names(1)[0])] == [9]
    assert s.jobs_on(names(3)[2]) == []
    s.jobs = None
    assert s.jobs_on(names(1)[0]) == []


def test_a_slow_poll_stretches_the_pause_after_it() -> None:
    settings = SyncSettings(poll_interval_s=1.0, max_poll_share=0.2)
    assert poll_pause(0.1, settings) == 0.9  # a quick poll: the rest of the interval
    assert poll_pause(2.0, settings) == 8.0  # a 2 s poll: polling stays at 20% of the time
    assert poll_pause(5.0, SyncSettings(poll_interval_s=1.0, max_poll_share=1.0)) == 0.05


def test_between_full_reads_a_poll_asks_only_for_changes_and_keeps_the_view_it_holds() -> None:
    """At rest slurmrestd answers "unchanged" (304) and the syncer keeps its view, parsing
    nothing; every ``full_pass_s`` it reads everything; after a failed poll it reads
    everything; the "since" it asks about is when its view was current, less the margin."""
    clock = ManualClock(1_800_000_000.0)
    s, slurm = make(10, clock)
    s.slurm, s.jobs = None, None  # a syncer that has not polled yet

    async def poll() -> bool:
        return await s.poll_slurm()

    assert asyncio.run(poll()) and slurm.reads == ["*"] and slurm.since == []
    held = s.slurm
    slurm.unchanged = True
    clock.advance(5)
    assert asyncio.run(poll())
    assert slurm.reads == ["*"], "asked for changes only"
    assert slurm.since == [1_800_000_000.0 - s.settings.changed_since_margin_s]
    assert s.slurm is held, "an unchanged answer keeps the view held"
    clock.advance(5)
    asyncio.run(poll())
    assert slurm.since[-1] == 1_800_000_005.0 - s.settings.changed_since_margin_s
    # A change: Slurm answers with every node; the view is replaced.
    slurm.unchanged = False
    slurm.views[next(iter(slurm.views))] = slurm_sync.SlurmView("down", frozenset(), "x")
    clock.advance(5)
    asyncio.run(poll())
    assert s.slurm is not held and s.slurm == slurm.views
    # The safety net: a full read every full_pass_s, whatever Slurm says.
    slurm.unchanged = True
    reads = len(slurm.reads)
    clock.advance(s.settings.full_pass_s)
    asyncio.run(poll())
    assert len(slurm.reads) == reads + 1 and slurm.reads[-1] == "*"
    # A failed poll forgets the view (fail closed); the next poll reads in full.
    slurm.down = True
    clock.advance(1)
    assert not asyncio.run(poll()) and s.slurm is None
    slurm.down = False
    since = len(slurm.since)
    clock.advance(1)
    assert asyncio.run(poll()) and slurm.reads[-1] == "*" and len(slurm.since) == since


def test_a_negative_margin_reads_everything_on_every_poll() -> None:
    clock = ManualClock(1_800_000_000.0)
    s, slurm = make(4, clock)
    s.settings = replace(s.settings, changed_since_margin_s=-1)
    slurm.unchanged = True
    for _ in range(3):
        clock.advance(1)
        asyncio.run(s.poll_slurm())
    assert slurm.since == [] and slurm.reads == ["*", "*", "*"]
