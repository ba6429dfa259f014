"""The syncer answers the gate's probe from a fresh read, and never reports "drained and idle"
from a read taken before its own drain (issue 33, defects 5 and 7)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.clock import ManualClock
from gpufleet.domain import emptiness, slurm_sync, well_known
from gpufleet.domain.emptiness import Probe, SlurmWork
from gpufleet.slurm.syncer import Syncer

from ..fakes import FakeSlurm
from .fakes import RecordingKube
from .test_work_report import draining, make, work_patches
from .test_write_batches import node


def probed(body: dict[str, Any], pid: str = "p-1", incident: float | None = 5.0) -> dict[str, Any]:
    body["metadata"]["annotations"][well_known.ANNOTATION_SLURM_PROBE] = Probe(
        pid, 10.0, incident
    ).to_annotation()
    return body


def answers(kube: RecordingKube) -> list[SlurmWork]:
    out = []
    for text in work_patches(kube):
        work = SlurmWork.from_annotation(text)
        if work is not None and work.probe is not None:
            out.append(work)
    return out


def test_a_probe_is_answered_once_from_slurm_as_it_is_now_not_from_the_last_poll() -> None:
    slurm = FakeSlurm(["n1"])
    s, kube = make(slurm, {"n1": probed(draining("n1", 5.0))}, [])  # the last poll: no job
    # Since the poll, Slurm allocated a job on the node (drained meanwhile).
    slurm.views["n1"] = slurm_sync.SlurmView("allocated", frozenset({"DRAIN"}), "gpufleet: x")
    job = slurm_sync.JobView(job_id=77, priority=1, requeueable=True, nodes=frozenset({"n1"}))
    slurm.jobs = [job]
    assert s._probe_due("n1", s.nodes["n1"])
    asyncio.run(s.answer_probe("n1"))
    [answer] = answers(kube)
    assert answer.probe == "p-1" and answer.incident == 5.0
    assert answer.jobs == ("77",) and not answer.empty
    assert "n1" in slurm.reads  # read afresh, not from the poll
    asyncio.run(s.answer_probe("n1"))
    assert len(answers(kube)) == 1  # one answer per probe
    assert not s._probe_due("n1", s.nodes["n1"])


def test_a_node_slurm_does_not_know_by_any_name_is_reported_absent() -> None:
    slurm = FakeSlurm(["gpu-a"])
    slurm.views["gpu-a"] = slurm_sync.SlurmView("idle", addresses=frozenset({"10.0.0.9"}))
    n1 = probed(draining("n1", 5.0))
    s, kube = make(slurm, {"n1": n1}, [])
    asyncio.run(s.answer_probe("n1"))
    [answer] = answers(kube)
    assert answer.absent and emptiness.is_slurm_node(answer, emptiness.SlurmWait.AUTO) is False


def test_a_slurm_node_with_another_name_is_found_by_its_address_and_judged() -> None:
    slurm = FakeSlurm(["gpu-a"])
    slurm.views["gpu-a"] = slurm_sync.SlurmView("mixed", addresses=frozenset({"10.0.0.9"}))
    n1 = probed(draining("n1", 5.0))
    n1.setdefault("status", {})["addresses"] = [{"type": "InternalIP", "address": "10.0.0.9"}]
    s, kube = make(slurm, {"n1": n1}, [])
    asyncio.run(s.answer_probe("n1"))
    [answer] = answers(kube)
    assert not answer.absent and answer.state == "mixed" and not answer.empty


def test_a_silent_slurm_leaves_the_probe_unanswered_and_it_is_asked_again() -> None:
    slurm = FakeSlurm(["n1"])
    s, kube = make(slurm, {"n1": probed(draining("n1", 5.0))}, [])
    slurm.down = True
    asyncio.run(s.answer_probe("n1"))
    assert answers(kube) == []
    assert s._probe_due("n1", s.nodes["n1"])  # not marked answered: the next event retries


def test_work_is_not_reported_idle_from_the_read_taken_before_our_drain() -> None:
    # Defect 5: the drain's fresh read saw the node idle; a job was allocated between that
    # read and the DRAIN. No report comes from that read; the next poll's read does.
    slurm = FakeSlurm(["n1"])
    s, kube = make(slurm, {"n1": draining("n1", 5.0)}, [])
    real_drain = slurm.drain

    async def drain_after_a_job_lands(target: Any, reason: str) -> None:
        slurm.views["n1"] = slurm_sync.SlurmView("allocated", frozenset(), None)
        slurm.jobs = [
            slurm_sync.JobView(job_id=9, priority=1, requeueable=True, nodes=frozenset({"n1"}))
        ]
        await real_drain(target, reason)

    slurm.drain = drain_after_a_job_lands  # type: ignore[method-assign]
    asyncio.run(s.reconcile("n1"))
    assert slurm.calls and slurm.calls[0][0] == "drain"
    assert work_patches(kube) == []  # nothing said from the read before the drain
    assert asyncio.run(s.poll_slurm(full=True))
    asyncio.run(s.reconcile("n1"))
    [report] = [SlurmWork.from_annotation(t) for t in work_patches(kube)]
    assert report is not None and not report.empty and report.jobs == ("9",)


def test_an_unmarked_node_in_slurm_is_answered_too() -> None:
    # Defect 7: no label, no taint, no earlier report: still Slurm's word is asked and given.
    slurm = FakeSlurm(["n1"])
    s, kube = make(slurm, {"n1": probed(node("n1"), incident=None)}, [])
    asyncio.run(s.answer_probe("n1"))
    [answer] = answers(kube)
    assert answer.state == "idle" and not answer.absent and answer.incident is None
    assert isinstance(s, Syncer)


def test_an_answer_newer_than_the_last_poll_is_not_written_over_from_that_poll() -> None:
    # The gate's probe finds a job the last poll has not seen (an admin resumed the node and
    # a job started). The Node event of the answer reconciles the node from that poll: the
    # answer stays, or the gate would miss it and take Slurm for silent. A poll that began
    # after the answer may replace it.
    clock = ManualClock()
    slurm = FakeSlurm(["n1"])
    s = Syncer(kube=(kube := RecordingKube()), rest=slurm, scontrol=slurm, clock=clock)
    s.nodes, s.slurm, s.jobs = {"n1": draining("n1", 5.0)}, dict(slurm.views), []
    asyncio.run(s.reconcile("n1"))  # drained by the syncer
    clock.advance(1.0)
    assert asyncio.run(s.poll_slurm(full=True))
    asyncio.run(s.reconcile("n1"))
    assert [w.state for w in reports(kube)] == ["idle+DRAIN"]
    slurm.views["n1"] = slurm_sync.SlurmView(
        "mixed", frozenset({"DRAIN"}), slurm.views["n1"].reason
    )
    slurm.jobs = [
        slurm_sync.JobView(job_id=8, priority=1, requeueable=False, nodes=frozenset({"n1"}))
    ]
    clock.advance(1.0)
    probed(s.nodes["n1"], "p-2")
    asyncio.run(s.answer_probe("n1"))
    asyncio.run(s.reconcile("n1"))  # the answer's own Node event
    last = reports(kube)[-1]
    assert last.probe == "p-2" and last.jobs == ("8",)
    clock.advance(1.0)
    slurm.views["n1"] = slurm_sync.SlurmView("idle", frozenset({"DRAIN"}), slurm.views["n1"].reason)
    slurm.jobs = []
    assert asyncio.run(s.poll_slurm(full=True))  # began after the answer: its word counts
    asyncio.run(s.reconcile("n1"))
    last = reports(kube)[-1]
    assert last.probe is None and last.empty


def reports(kube: RecordingKube) -> list[SlurmWork]:
    return [w for t in work_patches(kube) if (w := SlurmWork.from_annotation(t)) is not None]
