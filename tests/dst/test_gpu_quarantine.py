"""Per-GPU quarantine in the deterministic simulation: bounded runs with the FleetPolicy's
gpuQuarantine on hold every invariant, 9 included (:mod:`gpufleet.dst.quarantine`), and do
quarantine GPUs, take their nodes out for the repair and release them once verified."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpufleet.domain.records import NodeRecord, QuarantinedGpu, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.domain.well_known import ANNOTATION_RECORD, CONTROLLER
from gpufleet.dst.invariants import record_in
from gpufleet.dst.kube import Write
from gpufleet.dst.quarantine import QuarantineChecks
from gpufleet.dst.runner import Result, Spec, run
from gpufleet.dst.scenario import Config
from gpufleet.kubeapi import NODES

S = NodeState

QUARANTINE = Config(duration=300.0, calm_s=500.0, quarantine=True)
"""A long calm: a repair the budget held until the faults stopped still ends in the run."""
SEEDS = 4
"""About 5 s each on two cores."""


def _said(r: Result, reason: str) -> int:
    return sum(1 for ln in r.lines if f" {reason} " in ln.text())


def test_runs_with_gpu_quarantine_hold_every_invariant_and_release_gpus() -> None:
    quarantined = released = 0
    for seed in range(SEEDS):
        r = run(Spec(seed, QUARANTINE))
        assert r.violation is None, (seed, r.violation)
        quarantined += _said(r, "GpuQuarantined")
        released += _said(r, "GpuReleased")
    assert quarantined > 0, "no run quarantined a GPU: the path was not exercised"
    assert released > 0, "no quarantine ended with a verified repair"


def _node(state: NodeState, gpus: tuple[int, ...], cordoned: bool = False) -> dict[str, Any]:
    rec = replace(
        NodeRecord.new("n1", at=0, state=state),
        quarantined_gpus=tuple(QuarantinedGpu(i, "", "xid-48", 1.0) for i in gpus),
    )
    return {
        "metadata": {"name": "n1", "annotations": {ANNOTATION_RECORD: record_to_json(rec)}},
        "spec": {"unschedulable": cordoned},
    }


def _write(before: dict[str, Any], after: dict[str, Any]) -> Write:
    return Write(CONTROLLER, str(NODES), "", "n1", "patch", before, after, 1.0)


def test_invariant_9_fails_a_quarantine_that_takes_the_node_or_ends_unverified() -> None:
    failed: list[str] = []
    checks = QuarantineChecks(lambda inv, node, text: failed.append(inv), record_in)
    checks.on_write(_write(_node(S.PRODUCTION, ()), _node(S.PRODUCTION, (3,))))
    assert failed == [] and checks.quarantines == 1
    checks.on_write(_write(_node(S.PRODUCTION, ()), _node(S.PRODUCTION, (3,), cordoned=True)))
    checks.on_write(_write(_node(S.PRODUCTION, ()), _node(S.DRAINING, (3,))))
    assert failed == ["9a", "9a"]
    checks.on_write(_write(_node(S.VERIFYING, (3,)), _node(S.PRODUCTION, ())))
    assert failed == ["9a", "9a"] and checks.released == 1
    checks.on_write(_write(_node(S.PRODUCTION, (3,)), _node(S.PRODUCTION, ())))
    assert failed == ["9a", "9a", "9b"]
