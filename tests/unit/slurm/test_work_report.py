"""The syncer tells the lifecycle controller what Slurm runs on a node Kubernetes wants out
(annotation ``gpufleet.io/slurm-work``, docs/decisions/0076): bound to the incident, written
when it changes, removed in service, never written on an unknown Slurm view."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from gpufleet.domain import slurm_sync, well_known
from gpufleet.domain.emptiness import SlurmWork
from gpufleet.domain.records import Incident, NodeRecord, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.slurm.syncer import Syncer, SyncSettings

from ..fakes import FakeSlurm
from .fakes import RecordingKube
from .test_write_batches import node


def draining(name: str, opened_at: float) -> dict[str, Any]:
    n = node(name, "Xid79", state="draining")
    inc = Incident(key="xid-79", description="x", opened_at=opened_at, plan=None)
    rec = replace(NodeRecord.new(name, at=0, state=NodeState.DRAINING), incident=inc)
    n["metadata"]["annotations"][well_known.ANNOTATION_RECORD] = record_to_json(rec)
    return n


def work_patches(kube: RecordingKube) -> list[Any]:
    out = []
    for _, patch in kube.patches:
        ann = (patch.get("metadata") or {}).get("annotations") or {}
        if well_known.ANNOTATION_SLURM_WORK in ann:
            out.append(ann[well_known.ANNOTATION_SLURM_WORK])
    return out


def make(slurm: FakeSlurm, nodes: dict[str, Any], jobs: list[Any]) -> tuple[Syncer, RecordingKube]:
    kube = RecordingKube()
    s = Syncer(
        kube=kube,
        rest=slurm,
        scontrol=slurm,
        settings=SyncSettings(hold_taint=False),
    )
    s.nodes, s.slurm, s.jobs = nodes, dict(slurm.views), jobs
    return s, kube


def test_report_names_jobs_and_incident_and_is_not_rewritten_unchanged() -> None:
    slurm = FakeSlurm(["n1"])
    job = slurm_sync.JobView(job_id=42, priority=1, requeueable=False, nodes=frozenset({"n1"}))
    slurm.jobs = [job]
    s, kube = make(slurm, {"n1": draining("n1", 123.0)}, [job])
    asyncio.run(s.reconcile("n1"))  # drains it: nothing reported from the read before that
    assert work_patches(kube) == []
    assert asyncio.run(s.poll_slurm(full=True))  # a read after the drain
    asyncio.run(s.reconcile("n1"))
    texts = work_patches(kube)
    assert len(texts) == 1
    work = SlurmWork.from_annotation(texts[0])
    assert work is not None and work.incident == 123.0 and work.jobs == ("42",)
    assert work.drained and not work.empty  # drained, but job 42 still runs
    asyncio.run(s.reconcile("n1"))
    assert len(work_patches(kube)) == 1  # same report within the heartbeat: no write
    slurm.jobs = []
    assert asyncio.run(s.poll_slurm(full=True))
    asyncio.run(s.reconcile("n1"))
    last = SlurmWork.from_annotation(work_patches(kube)[-1])
    assert last is not None and last.empty


def test_report_removed_in_production_and_absent_when_slurm_is_unknown() -> None:
    slurm = FakeSlurm(["n1", "n2"])
    n1 = node("n1")
    n1["metadata"]["annotations"][well_known.ANNOTATION_SLURM_WORK] = '{"state":"idle","jobs":[]}'
    s, kube = make(slurm, {"n1": n1, "n2": draining("n2", 5.0)}, [])
    asyncio.run(s.reconcile("n1"))
    assert work_patches(kube) == [None]
    s.jobs = None  # the last poll failed: what runs is unknown
    asyncio.run(s.reconcile("n2"))
    assert [p for p in work_patches(kube) if p is not None] == []
