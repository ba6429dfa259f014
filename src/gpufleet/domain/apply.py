"""The fleet view after a decision: one rule for every executor.

The controller, the simulator and the domain tests each keep a
:class:`~gpufleet.domain.records.FleetView` and must account for every
decision the same way, or the safety rails (budget, breaker, rate limit) would
count differently in the simulator than in production. This is that rule.
"""

from __future__ import annotations

from dataclasses import replace

from gpufleet.domain.decide import Decision
from gpufleet.domain.policy import Policy
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.safety import prune_actions


def apply_decision(
    fleet: FleetView,
    before: NodeRecord | None,
    decision: Decision,
    *,
    now: float,
    policy: Policy,
) -> FleetView:
    """``fleet`` after ``decision`` was taken at ``now`` on the node whose record was ``before``.

    Pool counts follow the decided record (``before`` is None for a node the
    view has not counted yet); the breaker becomes the decision's breaker when
    it carries one; a decision with a disruptive action adds ``now`` to the
    recent actions (pruned to the rate-limit window), so the next decision sees
    it in the rate limit.
    """
    view = fleet.with_change(before, decision.record)
    if decision.breaker is not None:
        view = replace(view, breaker=decision.breaker)
    if any(a.disruptive for a in decision.actions):
        recent = prune_actions(view.recent_actions, now=now, config=policy.safety.rate_limit)
        view = replace(view, recent_actions=(*recent, now))
    return view
