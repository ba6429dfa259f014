"""The controller's in-memory view of the fleet, rebuilt from the Node watch.

Kubernetes is the database: every record here is a copy of a Node's
``gpufleet.io/record`` annotation (or of the write the controller just made),
and the breaker and recent actions are persisted in the FleetPolicy status. A
restarted controller rebuilds all of it from the watch.

Decisions that read the fleet view (budget, breaker, rate limit) are taken
under :attr:`Fleet.lock`, and the decided record is put into the view before
the lock is released, so two concurrent faults cannot both take the last
budget slot.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace

from gpufleet.domain.apply import apply_decision
from gpufleet.domain.decide import Decision
from gpufleet.domain.policy import Policy
from gpufleet.domain.records import FleetView, NodeRecord
from gpufleet.domain.safety import BreakerState
from gpufleet.domain.states import NodeState


class Fleet:
    """Records of every node, the breaker and recent disruptive actions."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.records: dict[str, NodeRecord] = {}
        self.breaker = BreakerState()
        self.recent_actions: tuple[float, ...] = ()
        self._view: FleetView | None = None
        self.dirty_breaker = False

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
        if self._view is not None:
            if before is None:
                self._view = None  # a new node changes a pool's size
            else:
                self._view = self._view.with_change(before, record)

    def forget(self, name: str) -> None:
        if self.records.pop(name, None) is not None:
            self._view = None

    def apply(self, decision: Decision, now: float, policy: Policy) -> None:
        """Account for a decision (the domain's rule): its record, breaker, disruptive actions.

        A changed breaker or a newly counted disruptive action marks the
        FleetPolicy status dirty, so it is saved and survives a restart.
        """
        record = decision.record
        after = apply_decision(
            self.view(), self.records.get(record.name), decision, now=now, policy=policy
        )
        self.records[record.name] = record
        self._view = after
        if after.breaker != self.breaker or after.recent_actions != self.recent_actions:
            self.dirty_breaker = True
        self.breaker = after.breaker
        self.recent_actions = after.recent_actions

    def states(self) -> Counter[NodeState]:
        return Counter(r.state for r in self.records.values())
