"""Fabric faults judged with their NVLink domain in the deterministic simulation: bounded runs
with the environment's ``domain-fault`` (one or two trays of a domain logging a fabric fault at
once) hold every invariant, 10 included (:mod:`gpufleet.dst.domain_faults`), and do take a
domain out as one and release it into verification once its fabric is healthy again."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpufleet.domain import domain_faults
from gpufleet.domain.ladder import Step
from gpufleet.domain.records import Incident, NodeRecord, StepAttempt, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.domain.well_known import ANNOTATION_RECORD, CONTROLLER
from gpufleet.dst.domain_faults import DomainFaultChecks, with_domain_faults
from gpufleet.dst.kube import Write
from gpufleet.dst.runner import Result, Spec, run
from gpufleet.dst.scenario import Config
from gpufleet.kubeapi import NODES

S = NodeState

DOMAIN_FAULTS = with_domain_faults(Config(duration=300.0, calm_s=200.0), weight=6)
SEEDS = 4
"""About 4 s each on two cores."""


def _said(r: Result, reason: str) -> int:
    return sum(1 for ln in r.lines if f" {reason} " in ln.text())


def test_runs_with_domain_faults_hold_every_invariant_and_release_the_domain() -> None:
    faulted = repaired = 0
    for seed in range(SEEDS):
        r = run(Spec(seed, DOMAIN_FAULTS))
        assert r.violation is None, (seed, r.violation)
        faulted += _said(r, "DomainFaulted")
        repaired += _said(r, "DomainRepaired")
    assert faulted > 0, "no run judged a domain faulty: the path was not exercised"
    assert repaired > 0, "no held domain was released into verification"


def _node(state: NodeState, incident: Incident | None) -> dict[str, Any]:
    rec = replace(
        NodeRecord.new("n1", at=0, state=state), incident=incident, nvlink_domain="nvl72-0"
    )
    return {"metadata": {"name": "n1", "annotations": {ANNOTATION_RECORD: record_to_json(rec)}}}


def _write(before: dict[str, Any], after: dict[str, Any]) -> Write:
    return Write(CONTROLLER, str(NODES), "", "n1", "patch", before, after, 1.0)


def test_invariant_10_fails_a_step_on_a_held_tray_and_a_hold_left_for_production() -> None:
    failed: list[str] = []
    checks = DomainFaultChecks(lambda inv, node, text, **_: failed.append(text))
    held = Incident(domain_faults.KEY, "NVLink domain nvl72-0 faulty", 5.0, None, drained=True)
    own = Incident("fabric-degraded", "fabric", 5.0, Step.REBOOT)
    checks.on_write(_write(_node(S.DRAINING, own), _node(S.DRAINING, held)))
    assert failed == [] and checks.held == 1
    stepped = replace(held, current=Step.REBOOT, tried=(StepAttempt(Step.REBOOT, 1, 6.0),))
    checks.on_write(_write(_node(S.DRAINING, held), _node(S.REMEDIATING, stepped)))
    assert len(failed) == 1 and "ladder step (reboot) started" in failed[0]
    released = replace(held, plan=Step.GPU_RESET)
    checks.on_write(_write(_node(S.DRAINING, held), _node(S.VERIFYING, released)))
    assert len(failed) == 1 and checks.released == 1
    checks.on_write(_write(_node(S.DRAINING, held), _node(S.PRODUCTION, None)))
    assert len(failed) == 2 and "left the hold" in failed[1]
