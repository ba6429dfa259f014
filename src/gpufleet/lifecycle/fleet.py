"""The controller's in-memory view of the fleet, rebuilt from the Node watch.

Kubernetes is the database: every record here is a copy of a Node's
``gpufleet.io/record`` annotation (or of the write the controller just made),
and the breaker and recent actions are persisted in the FleetPolicy status. A
restarted controller rebuilds all of it from the watch.

Decisions that read the fleet view (budget, breaker, rate limit) are taken
under :attr:`Fleet.lock`, and the decided record is put into the view before
the lock is released, so two concurrent faults cannot both take the last
budget slot.

Everything the periodic tick reads is kept up to date as records change, not
recomputed from all records on every tick: the count per state (gauges), the
nodes a tick has something to do for (:meth:`Fleet.ticking`), and a change
counter (:attr:`Fleet.generation`) that tells whether a fleet-wide answer (the
spare pool's) can have changed. At rest a 12,500-node fleet's tick then costs
what its few busy nodes cost (docs/decisions/0113).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from gpufleet.domain.apply import apply_decision
from gpufleet.domain.decide import Decision
from gpufleet.domain.policy import DomainBudget, Override, Policy
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.safety import BreakerState
from gpufleet.domain.states import NodeState

QUIET = frozenset(
    {
        NodeState.PRODUCTION,
        NodeState.TRIAGE,
        NodeState.RMA,
        NodeState.MAINTENANCE,
        NodeState.PROVISIONING,
    }
)
"""States in which a tick has nothing to do for a node, unless a fault is pending
(a provisioning node is looked at only once Ready: :meth:`Fleet.ticking`)."""


def _ticked(record: NodeRecord) -> bool:
    """Whether the tick looks at this node: not quiet, a held fault, provisioning, or a
    quarantined GPU (its repair falls due on a tick, domain.gpu_quarantine)."""
    return (
        record.state not in QUIET
        or record.pending is not None
        or record.state is NodeState.PROVISIONING
        or bool(record.quarantined_gpus)
    )


class Fleet:
    """Records of every node, the breaker and recent disruptive actions."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.records: dict[str, NodeRecord] = {}
        self.breaker = BreakerState()
        self.recent_actions: tuple[float, ...] = ()
        self._view: FleetView | None = None
        self.dirty_breaker = False
        self._counts: Counter[NodeState] = Counter()
        self._ticked: dict[str, None] = {}
        """Names the tick looks at (a dict: an ordered set)."""
        self._grouped_by: tuple[tuple[Override, ...], DomainBudget | None, bool] | None = None
        """The FleetPolicy overrides and per-domain budget the records' groups and NVLink
        domains were last computed with."""
        self.generation = 0
        """Incremented whenever a record is added, changed or removed."""

    def _index(self, before: NodeRecord | None, after: NodeRecord | None) -> None:
        """Keep the counts and the tick's index in step with one record's change."""
        if before == after:
            return
        self.generation += 1
        if before is not None:
            self._counts[before.state] -= 1
        if after is not None:
            self._counts[after.state] += 1
        if after is not None and _ticked(after):
            self._ticked[after.name] = None
        elif before is not None:
            self._ticked.pop(before.name, None)

    def ticking(self) -> list[tuple[str, NodeRecord]]:
        """The nodes a tick looks at: those not in a quiet state, those with a held
        fault, and provisioning ones (the tick checks whether they are Ready)."""
        records = self.records
        return [(name, records[name]) for name in list(self._ticked) if name in records]

    def view(self) -> FleetView:
        if self._view is None:
            self._view = FleetView.of(
                self.records.values(), breaker=self.breaker, recent_actions=self.recent_actions
            )
        return replace(self._view, breaker=self.breaker, recent_actions=self.recent_actions)

    def put(self, record: NodeRecord) -> None:
        """Store a node's record (from the watch or from a decision)."""
        before = self.records.get(record.name)
        self.records[record.name] = record
        self._index(before, record)
        if self._view is not None:
            if before is None:
                self._view = None  # a new node changes a pool's size
            else:
                self._view = self._view.with_change(before, record)

    def regroup(
        self, policy: Policy, group_of: Callable[[str, Policy], tuple[str, str] | None]
    ) -> None:
        """Every record's node group and NVLink domain (``group_of``) under ``policy``'s
        overrides and per-domain budget, when they changed since the last call (a group's
        or a domain's budget counts every node of it, not only those that had an event
        since the policy changed)."""
        grouped_by = (
            policy.overrides,
            policy.safety.budget.per_domain,
            policy.domain_faults.enabled,  # the domain is read for it too (decision 0240)
        )
        if self._grouped_by == grouped_by:
            return
        self._grouped_by = grouped_by
        for name, record in list(self.records.items()):
            found = group_of(name, policy)
            if found is not None and found != (record.group, record.nvlink_domain):
                self.put(replace(record, group=found[0], nvlink_domain=found[1]))

    def forget(self, name: str) -> None:
        before = self.records.pop(name, None)
        if before is not None:
            self._index(before, None)
            self._view = None

    def apply(self, decision: Decision, now: float, policy: Policy) -> None:
        """Account for a decision (the domain's rule): its record, breaker, disruptive actions.

        A changed breaker or a newly counted disruptive action marks the
        FleetPolicy status dirty, so it is saved and survives a restart.
        """
        record = decision.record
        before = self.records.get(record.name)
        after = apply_decision(self.view(), before, decision, now=now, policy=policy)
        self.records[record.name] = record
        self._index(before, record)
        self._view = after
        if after.breaker != self.breaker or after.recent_actions != self.recent_actions:
            self.dirty_breaker = True
        self.breaker = after.breaker
        self.recent_actions = after.recent_actions

    def states(self) -> Counter[NodeState]:
        """Nodes per state (kept as records change: no pass over the fleet)."""
        return +self._counts  # a copy without the states no node is in
