"""A domain-scope MaintenancePlan in the deterministic simulation (decision 0244):
invariant 12 fires on the writes that break it and only on those, and bounded runs with the
plan hold every invariant (the plan's trays out together are not held against k by
invariant 4)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.domain import maintenance as mt
from gpufleet.domain.records import Incident, NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.dst.runner import Spec, run
from gpufleet.dst.scenario import Config, dst_policy
from gpufleet.dst.world import World

from .test_invariants import CTL, _write, domain_world

S = NodeState
RUN = Config(duration=300.0, calm_s=120.0, domains=True, domain_plan=True)
SEEDS = 2
"""Short runs with the plan (each well under ten seconds)."""


def _world() -> World:
    """n1, n3 in nvl72-0; n2, n4 in nvl72-1; at most one tray of a domain out."""
    return domain_world(dst_policy(domains=True))


def _tray(node: str, state: S, *, acting: bool = False) -> NodeRecord:
    inc = Incident(
        key=mt.incident_key("fw"),
        description=mt.reason("fw", mt.Action.COMMAND, None, "fw", whole_domain="nvl72-0"),
        opened_at=1.0,
        plan=None,
        drained=True,
        whole_domain="nvl72-0",
        acting_since=5.0 if acting else None,
    )
    return replace(
        NodeRecord(name=node, state=state, since=2.0, reason="r", incident=inc),
        nvlink_domain="nvl72-0",
    )


def test_a_command_asked_while_another_tray_drains_breaks_invariant_12() -> None:
    w = _world()
    _write(w, CTL, "n1", _tray("n1", S.DRAINING))
    _write(w, CTL, "n3", _tray("n3", S.DRAINING))  # both out: k 1 yields to the plan
    _write(w, CTL, "n3", _tray("n3", S.MAINTENANCE))
    assert w.violations == []
    _write(w, CTL, "n3", _tray("n3", S.MAINTENANCE, acting=True))
    assert [v.category for v in w.violations] == ["12/not-empty"]


def test_a_tray_returned_before_the_others_answered_breaks_invariant_12() -> None:
    w = _world()
    for node in ("n1", "n3"):
        _write(w, CTL, node, _tray(node, S.MAINTENANCE))
        _write(w, CTL, node, _tray(node, S.MAINTENANCE, acting=True))
    assert w.violations == []
    _write(w, CTL, "n1", _tray("n1", S.VERIFYING, acting=True))
    assert [v.category for v in w.violations] == ["12/returned-early"]


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_run_with_a_domain_scope_plan_holds_every_invariant(seed: int) -> None:
    r = run(Spec(seed, RUN), keep_trace=False)
    assert r.violation is None, r.violation.line()
    emptied = [ln for ln in r.lines if "state=maintenance" in ln.text()]
    assert emptied, "the plan never took a domain out"
