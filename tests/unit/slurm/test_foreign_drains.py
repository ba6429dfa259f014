"""Foreign drains and the repair loop, with in-memory Slurm and Kubernetes (the real
daemons are in tests/integration/test_slurm_health.py): a hardware reason raises
``SlurmHealthProblem`` once, is taken over only after the lifecycle controller took
the node out, and is resumed only when it returns to production; a person's or a
job's drain is never touched."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gpufleet.domain import conditions, slurm_sync, well_known
from gpufleet.domain.faults import FaultKind
from gpufleet.domain.records import NodeRecord, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.slurm import nodes as kn
from gpufleet.slurm.syncer import Syncer, SyncSettings

from ..fakes import FakeSlurm
from .fakes import RecordingKube

NAME = "gpu-node-0"


def node(state: NodeState = NodeState.PRODUCTION, *, managed: bool = True) -> dict[str, Any]:
    annotations = {}
    if managed:
        annotations[well_known.ANNOTATION_RECORD] = record_to_json(
            NodeRecord.new(NAME, at=0.0, state=state)
        )
    return {
        "metadata": {
            "name": NAME,
            "labels": {well_known.LABEL_STATE: state.value},
            "annotations": annotations,
        },
        "spec": {},
        "status": {"conditions": []},
    }


def syncer(slurm: FakeSlurm, n: dict[str, Any]) -> Syncer:
    s = Syncer(
        kube=RecordingKube(),
        rest=slurm,
        scontrol=slurm,
        settings=SyncSettings(hold_taint=False),
    )
    s.nodes = {NAME: n}
    s.jobs = []
    return s


def step(s: Syncer, slurm: FakeSlurm) -> None:
    """One poll pass for the node: the snapshot from Slurm, then reconcile."""
    s.slurm = dict(slurm.views)
    asyncio.run(s.reconcile(NAME))


def move(s: Syncer, state: NodeState) -> None:
    """Play the lifecycle controller: the node's state label and record."""
    n = s.nodes[NAME]
    n["metadata"]["labels"][well_known.LABEL_STATE] = state.value
    n["metadata"]["annotations"][well_known.ANNOTATION_RECORD] = record_to_json(
        NodeRecord.new(NAME, at=0.0, state=state)
    )


def health(s: Syncer) -> dict[str, Any] | None:
    for c in s.nodes[NAME]["status"]["conditions"]:
        if c["type"] == "SlurmHealthProblem":
            return dict(c)
    return None


def health_patches(s: Syncer) -> list[Any]:
    assert isinstance(s.kube, RecordingKube)
    return [
        p
        for _, p in s.kube.patches
        if any(
            c.get("type") == "SlurmHealthProblem" for c in p.get("status", {}).get("conditions", [])
        )
    ]


def drained(slurm: FakeSlurm, reason: str) -> None:
    slurm.views[NAME] = slurm_sync.SlurmView("idle", frozenset({"DRAIN"}), reason)


def test_a_hardware_drain_is_reported_once_taken_over_when_out_and_resumed_after_return() -> None:
    slurm = FakeSlurm([NAME])
    s = syncer(slurm, node())
    drained(slurm, "NHC: check_hw_ib: mlx5_0 port 1 DOWN")
    step(s, slurm)
    cond = health(s)
    assert cond is not None and cond["status"] == "True"
    faults = conditions.faults_of(NAME, cond["type"], cond["status"], cond["message"])
    assert [f.kind for f in faults] == [FaultKind.SLURM_DRAIN]
    assert "NHC: check_hw_ib" in faults[0].evidence.message
    # in production (the controller may be holding it back): the drain stays NHC's
    assert slurm.views[NAME].reason.startswith("NHC:")
    assert not slurm.calls
    step(s, slurm)
    assert len(health_patches(s)) == 1  # written once: its occurrence keeps its time
    # the controller took the node out: the syncer takes the drain over
    move(s, NodeState.DRAINING)
    step(s, slurm)
    assert slurm.views[NAME].ours and slurm.views[NAME].reason == "gpufleet: state draining"
    move(s, NodeState.REMEDIATING)
    step(s, slurm)
    move(s, NodeState.VERIFYING)
    step(s, slurm)
    assert slurm.views[NAME].drained, "not back before verification"
    still = health(s)
    assert still is not None and still["status"] == "True"
    # verification passed: back in production -> resumed, report cleared
    move(s, NodeState.PRODUCTION)
    step(s, slurm)
    assert not slurm.views[NAME].drained
    step(s, slurm)
    cleared = health(s)
    assert cleared is not None and cleared["status"] == "False"


def test_an_admin_drain_is_never_reported_as_a_fault_nor_taken_over() -> None:
    slurm = FakeSlurm([NAME])
    s = syncer(slurm, node())
    drained(slurm, "swapping the IB cable, bob")
    step(s, slurm)
    assert health(s) is None
    move(s, NodeState.DRAINING)  # out for another reason: the admin's drain still holds it
    step(s, slurm)
    move(s, NodeState.PRODUCTION)
    step(s, slurm)
    assert slurm.views[NAME].reason == "swapping the IB cable, bob"
    assert not any(c[0] in ("drain", "undrain") for c in slurm.calls)
    reported = s.nodes[NAME]["metadata"]["annotations"][well_known.ANNOTATION_SLURM_STATE]
    assert "bob" in reported


def test_a_job_problem_changes_nothing_on_the_node() -> None:
    slurm = FakeSlurm([NAME])
    s = syncer(slurm, node())
    drained(slurm, "batch job complete failure")
    step(s, slurm)
    assert health(s) is None and not slurm.calls


def test_an_unmanaged_node_is_reported_but_never_taken_over() -> None:
    # Without the lifecycle controller nothing can verify the node: the drain stays
    # its owner's, and the report does not hold the node out by itself.
    slurm = FakeSlurm([NAME])
    s = syncer(slurm, node(managed=False))
    drained(slurm, "Kill task failed")
    step(s, slurm)
    cond = health(s)
    assert cond is not None and cond["status"] == "True"
    view = kn.kube_view(s.nodes[NAME])
    assert view is not None and slurm_sync.out_reason(view) is None
    slurm.views[NAME] = slurm_sync.SlurmView("idle")  # its owner resumed it
    step(s, slurm)
    assert not slurm.calls
    cleared = health(s)
    assert cleared is not None and cleared["status"] == "False"


def test_gpufleet_s_node_side_health_check_drain_is_not_the_syncer_s_to_resume() -> None:
    slurm = FakeSlurm([NAME])
    s = syncer(slurm, node())
    drained(slurm, "gpufleet: health gpu-count: 7 of 8 GPUs visible")
    assert not slurm.views[NAME].ours
    step(s, slurm)  # in production on the Kubernetes side: our own drain would be resumed
    assert slurm.views[NAME].drained and not slurm.calls
    cond = health(s)
    assert cond is not None and "gpu-count" in cond["message"]


def test_a_changed_hardware_reason_is_a_new_occurrence_and_a_dry_run_writes_nothing() -> None:
    slurm = FakeSlurm([NAME])
    s = syncer(slurm, node())
    drained(slurm, "NHC: check_hw_ib failed")
    step(s, slurm)
    drained(slurm, "Kill task failed")
    step(s, slurm)
    assert len(health_patches(s)) == 2
    cond = health(s)
    assert cond is not None and "Kill task failed" in cond["message"]
    quiet = syncer(slurm, node())
    quiet.settings = SyncSettings(hold_taint=False, dry_run=True)
    step(quiet, slurm)
    assert health(quiet) is None
    assert json.dumps(health_patches(quiet)) == "[]"


def test_a_bare_not_responding_is_no_fault_but_slurm_s_down_not_responding_is() -> None:
    slurm = FakeSlurm([NAME])
    s = syncer(slurm, node())
    slurm.views[NAME] = slurm_sync.SlurmView("idle", frozenset({"NOT_RESPONDING"}))
    step(s, slurm)
    assert health(s) is None
    slurm.views[NAME] = slurm_sync.SlurmView(
        "down", frozenset({"NOT_RESPONDING"}), "Not responding"
    )
    step(s, slurm)
    cond = health(s)
    assert cond is not None and cond["status"] == "True"
