"""Whole runs: the same seed is the same run, a failure replays and shrinks, and a bounded
set of seeds finds nothing but the defects already written down.

``KNOWN`` lists the categories of violation today's code is known to produce (each with a
seed in docs/dst.md); a fix removes its line here, and a category not listed fails the
test. The seeds are short (300 virtual seconds) so the whole module stays well under two
minutes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.dst.runner import Result, Spec, run, shrink
from gpufleet.dst.scenario import Config, Env

SHORT = Config(duration=300.0, calm_s=120.0)

KNOWN = {
    "1/after-failed-verification",  # the ladder restarts at a rung with no emptiness check
    "1/after-step-timeout",  # a refused GPU reset escalates to a reboot after its timeout
    "1/hold-lifted-drained",  # a drain completion held by a rail, acted on later
    "1/pod-after-drain",  # a pod landed after the drain loop looked
    "1/after-held-success",  # a step succeeded, its verification was held: next rung
    "1/job-after-drain",  # a job allocated after the drain loop looked
    "1/stale-slurm-report",  # "drained and idle" from a jobs read older than the DRAIN
    "1/admin-resume-then-job",  # scontrol resume of a node gpufleet drained, then a job
    "1/forged-record",  # a record written by another identity is trusted
    "1/gpu-reset-pod-after-drain",
    "1/gpu-reset-job-after-drain",
    "1/gpu-reset-admin-resume-then-job",
    "1/gpu-reset-forged-record",
    "1b",  # a reimage's one-time network boot left armed
    "2/two-replicas",  # two replicas drive one attempt
    "2/after-restart",  # a restarted controller misreads a ForceOff it posted and posts again
    "2/same-incarnation",
    "2/stale-attempt",  # a BMC task posts for an attempt the ladder has moved past
    "3a/isolate",  # a later fault replaces a held one
    "3a/to-production",  # a return to production drops the held fault
    "3a/notice-lost",  # the Notice lost with its writer (killed before it posted)
    "3a/let-go-notice-lost",  # a held fault let go or dismissed, its Notice never posted
    "3b",  # a fault raised and cleared while no controller acted
    "4/two-replicas",  # two replicas each take the last budget slot
    "4/one-replica",  # a slot counted free before the write that frees it landed
    "5a",  # a replica isolates on a stale breaker
    "5b",  # held faults retried count as new faults: the breaker never closes
}


def test_the_same_seed_is_the_same_run() -> None:
    a = run(Spec(3, SHORT))
    b = run(Spec(3, SHORT))
    assert a.digest == b.digest
    assert [ln.text() for ln in a.lines] == [ln.text() for ln in b.lines]
    assert a.steps == b.steps and len(a.lines) > 100


def test_a_recorded_run_replays_exactly() -> None:
    a = run(Spec(4, SHORT))
    again = run(a.replay_spec())
    assert again.digest == a.digest
    assert again.choices == a.choices


def test_seeds_differ() -> None:
    assert len({run(Spec(s, replace(SHORT, duration=120.0))).digest for s in range(3)}) == 3


def _reaches_triage(node: str) -> object:
    def keeps(r: Result) -> bool:
        return any("state=triage" in ln.call and f"nodes {node} " in ln.call for ln in r.lines)

    return keeps


def test_shrinking_keeps_the_failure_and_drops_what_does_not_matter() -> None:
    """A dead GPU among unrelated events: what is left is the fault (the ladder ends in
    triage whatever else happens), with every choice at its default."""
    noise = tuple(Env(float(t), "pod", ("n2", False, False, 30)) for t in range(20, 200, 15))
    fault = Env(30.0, "fault", ("n1", "xid79-dead", 0))
    spec = Spec(5, replace(SHORT, duration=600.0), events=(*noise, fault), choices=None)
    first = run(spec)
    keeps = _reaches_triage("n1")
    assert keeps(first)  # type: ignore[operator]
    small = shrink(first, keeps=keeps, max_runs=60)  # type: ignore[arg-type]
    assert small.events == (fault,)
    assert not any(small.choices)
    assert keeps(run(small.replay_spec()))  # type: ignore[operator]


@pytest.mark.parametrize("seed", range(12))
def test_a_bounded_run_finds_only_known_defects(seed: int) -> None:
    r = run(Spec(seed, SHORT), keep_trace=False)
    if r.violation is None:
        return
    assert r.violation.category in KNOWN, r.violation.line()
    again = run(r.replay_spec(), keep_trace=False)
    assert again.digest == r.digest and again.violation is not None
    assert again.violation.line() == r.violation.line()
