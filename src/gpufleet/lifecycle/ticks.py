"""The periodic tick: retry held decisions, examine step and check timeouts, resume steps.

A decision held by a rail (budget, breaker, rate limit, pause) is not queued:
the tick decides again for every node that is not idle, so a hold lifts as soon
as the fleet allows it, and a restarted controller picks up where the records are.
Those nodes come from the fleet's index (:meth:`~gpufleet.lifecycle.fleet.Fleet.ticking`),
not from a pass over every record: at rest a tick costs what the busy nodes cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.clock import Clock
from gpufleet.domain import events as ev
from gpufleet.domain.safety import breaker_refresh
from gpufleet.lifecycle import nodes
from gpufleet.lifecycle.core import Feed, S
from gpufleet.lifecycle.domain_watch import DomainWatch
from gpufleet.lifecycle.drain_loop import Drains
from gpufleet.lifecycle.fleet import QUIET as IDLE
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.gated_steps import GatedSteps
from gpufleet.lifecycle.maintenance import MaintenancePlans
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.nodebook import NodeBook
from gpufleet.lifecycle.policy import PolicyKeeper
from gpufleet.lifecycle.spare_pool import SparePool
from gpufleet.lifecycle.tickets import Tickets


@dataclass
class Ticker:
    """``tick``: one Tick per non-idle node, then step resumes, spares, plans, status."""

    fleet: Fleet
    book: NodeBook
    policies: PolicyKeeper
    drains: Drains
    steps: GatedSteps
    spares: SparePool
    plans: MaintenancePlans
    tickets: Tickets
    metrics: Metrics
    feed: Feed
    clock: Clock
    domains: DomainWatch

    async def tick(self) -> None:
        """Retry held decisions and examine timeouts, node by node."""
        now = self.clock.now()
        policy = self.policies.effective()
        refreshed = breaker_refresh(
            self.fleet.breaker,
            now=now,
            config=policy.safety.breaker,
            fleet_size=self.fleet.view().size,
        )
        if refreshed != self.fleet.breaker:
            self.fleet.breaker = refreshed
            self.fleet.dirty_breaker = True
        if self.tickets.enabled:  # a ticket call due again (backoff), or after a restart
            for name in list(self.fleet.records):
                self.tickets.check(name)
        # Before the Ticks: a tray whose wait for its domain ends now is judged with it first.
        await self.domains.run()
        for name, record in self.fleet.ticking():
            if record.state in IDLE and record.pending is None and not record.quarantined_gpus:
                if record.state is S.PROVISIONING:
                    body = self.book.get(name)
                    if body is not None and nodes.is_ready(body):
                        await self.feed(name, ev.Tick())  # the node pass checks the inventory
                continue
            self.drains.ensure(record)
            await self.feed(name, ev.Tick())
        self.steps.resume()  # after the Ticks: a step they timed out is not resumed
        self.spares.promote("the pool's training capacity is short")
        await self.plans.run()
        if self.fleet.dirty_breaker:
            self.policies.schedule_status_save()
        self.policies.update_gauges()
        self.metrics.ticks.inc()
