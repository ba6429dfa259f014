"""Every ``gpufleet demo`` scenario, end to end, with assertions on its timeline."""

from __future__ import annotations

import pytest

from gpufleet.demo.job import JobShape
from gpufleet.demo.runner import Demo, ScenarioResult

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

SHAPE = JobShape()


def kinds(r: ScenarioResult, kind: str, node: str | None = None) -> list[str]:
    return [e.text for e in r.entries if e.kind == kind and (node is None or e.node == node)]


def order(r: ScenarioResult, *steps: tuple[str, str | None]) -> None:
    """Each (kind, node) happened, in this order."""
    last = 0.0
    for kind, node in steps:
        times = [e.t for e in r.entries if e.kind == kind and (node is None or e.node == node)]
        assert times, f"{kind} on {node} never happened"
        assert max(times) >= last, f"{kind} on {node} before the step that precedes it"
        last = min(t for t in times if t >= last)


def job_completed_with_bounded_loss(r: ScenarioResult) -> None:
    work = r.figures["work"]
    assert work is not None, "the job did not finish"
    assert work.steps == SHAPE.steps
    assert work.restarts >= 1 and work.resumed_at is not None and work.resumed_at > 0
    assert work.resumed_at % SHAPE.every == 0
    assert 0 <= work.repeated <= SHAPE.every, f"{work.repeated} steps repeated"
    assert kinds(r, "job-completed")


def test_xid79_job_resumes_from_its_checkpoint_and_the_node_returns(demo: Demo) -> None:
    r = demo.run("xid79")
    node = r.figures["faulty"]
    order(
        r,
        ("fault", node),
        ("condition", node),
        ("cordon", node),
        ("slurm-drain", node),
        ("bmc-reset", node),
        ("agent-result", node),
        ("uncordon", node),
        ("slurm-resume", node),
        ("train-done", None),
    )
    assert kinds(r, "job-requeued")
    assert len(kinds(r, "bmc-reset", node)) == 1
    job_completed_with_bounded_loss(r)
    assert r.figures["detect_s"] < 5 and r.figures["isolate_s"] < 5
    assert r.seconds < 180
