"""Invariant 8: a tray that waited for its NVLink domain's burn-in enters production only
with a passed verdict of its domain kept after the wait began (decision 0247); and a run
of the real controller in which both trays of a domain wait holds every invariant."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpufleet.domain import domain_burnin, well_known
from gpufleet.domain.records import NodeRecord, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.dst.invariants import Invariants
from gpufleet.dst.kube import node_body
from gpufleet.dst.runner import Spec, run
from gpufleet.dst.scenario import (
    NVLINK_DOMAIN,
    Config,
    Env,
    dst_policy,
    nvlink_domain_of,
    with_domain_burn_in,
)
from gpufleet.dst.world import World
from gpufleet.kubeapi import NODES

CTL = well_known.CONTROLLER
KEPT = well_known.ANNOTATION_DOMAIN_BURN_IN


def _world() -> World:
    w = World(1, ["n1", "n2", "n3", "n4"], replay=[], shuffle=False)
    w.stop_on_violation = False
    for i, n in enumerate(w.node_names):
        body = node_body(n)
        body["metadata"]["labels"][NVLINK_DOMAIN] = nvlink_domain_of(i)
        w.api.create("kubelet", NODES, body, None)
    Invariants(w, dst_policy(domains=True, domain_burn_in=True)).attach()
    return w


def _write(w: World, node: str, rec: NodeRecord, kept: str | None = None) -> None:
    ann = {well_known.ANNOTATION_RECORD: record_to_json(rec)}
    if kept is not None:
        ann[KEPT] = kept
    labels = {well_known.LABEL_STATE: rec.state.value}
    w.api.patch(CTL, NODES, node, {"metadata": {"annotations": ann, "labels": labels}})


def _waiting(node: str, domain: str, since: float) -> NodeRecord:
    r = NodeRecord(name=node, state=NodeState.BURN_IN, since=0.0, reason="waiting")
    return replace(r, nvlink_domain=domain, domain_wait=since)


def _verdict(domain: str, passed: bool, at: float) -> str:
    return domain_burnin.Recorded(domain, passed, at, "r").to_json()


def test_a_waiting_tray_that_returns_without_a_passed_verdict_breaks_invariant_8() -> None:
    w = _world()
    waiting = _waiting("n1", "nvl72-0", 10.0)
    _write(w, "n1", waiting)
    _write(w, "n1", replace(waiting, state=NodeState.PRODUCTION, domain_wait=None))
    assert [v.invariant for v in w.violations] == ["8"]
    assert "without a passed verdict" in w.violations[0].text


@pytest.mark.parametrize(
    "kept",
    [
        _verdict("nvl72-0", False, 12.0),
        _verdict("nvl72-1", True, 12.0),
        _verdict("nvl72-0", True, 9.0),
    ],
    ids=["failed", "another-domain", "before-the-wait"],
)
def test_only_its_own_domains_passed_verdict_after_the_wait_counts(kept: str) -> None:
    w = _world()
    waiting = _waiting("n1", "nvl72-0", 10.0)
    _write(w, "n1", waiting)
    _write(w, "n1", replace(waiting, state=NodeState.PRODUCTION, domain_wait=None), kept)
    assert [v.invariant for v in w.violations] == ["8"]


def test_a_passed_verdict_after_the_wait_lets_the_tray_return() -> None:
    w = _world()
    waiting = _waiting("n3", "nvl72-0", 10.0)
    _write(w, "n3", waiting)
    done = replace(waiting, state=NodeState.PRODUCTION, domain_wait=None)
    _write(w, "n3", done, _verdict("nvl72-0", True, 12.0))
    assert w.violations == []


def test_both_trays_of_a_domain_wait_for_its_burn_in_through_the_real_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both trays of nvl72-0 (n1, n3) fault at once and are repaired: a tray that passes its
    verification while the other is out waits; a failed verdict naming n3 sends it back to
    its ladder and holds n1; only the passed verdict returns them. Whether both are out
    when one passes depends on the run's scheduling: over four seeds some wait, and every
    tray that waited returns only with the passed verdict (n3, whose ladder the failed verdict
    may find spent, goes to triage then)."""
    waited: list[str] = []
    awaits = domain_burnin.awaits

    def spy(record: NodeRecord, fleet: Any, policy: Any) -> str | None:
        found = awaits(record, fleet, policy)
        if found is not None:
            waited.append(record.name)
        return found

    monkeypatch.setattr(domain_burnin, "awaits", spy)
    cfg = with_domain_burn_in(Config(duration=300.0, calm_s=120.0))
    events = (
        Env(10.0, "fault", ("n1", "xid79", 0)),
        Env(10.0, "fault", ("n3", "xid79", 1)),
        Env(200.0, "domain-burn-in", ("nvl72-0", "fail-named", "n3")),
        Env(250.0, "domain-burn-in", ("nvl72-0", "pass", "n1")),
    )
    runs_with_waits = 0
    for seed in range(1, 5):
        waited.clear()
        r = run(Spec(seed, cfg, events=events))
        assert r.violation is None, r.violation.line()
        back = [
            (line.at, line.call.split()[2])
            for line in r.story
            if line.proc.startswith("ctl") and "state=production" in line.call and line.at > 10
        ]
        if set(waited) == {"n1", "n3"}:
            runs_with_waits += 1
            # n3, sent back to its ladder by the failed verdict, returns with the passed one,
            # or goes to triage when that ladder had no rung left (which depends on the
            # run's scheduling: whether its first repair took one rung or more).
            last_n3 = [line.call for line in r.story if " n3 cas {state=" in line.call][-1:]
            assert "n1" in {n for _, n in back}, back
            assert "n3" in {n for _, n in back} or "state=triage" in last_n3[0], (seed, back)
            assert all(at >= 250.0 for at, _ in back), (seed, back)
    assert runs_with_waits >= 1
