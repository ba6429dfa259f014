"""The periodic tick: retry held decisions, examine step and check timeouts, resume BMC steps.

A decision held by a rail (budget, breaker, rate limit, pause) is not queued:
the tick decides again for every node that is not idle, so a hold lifts as soon
as the fleet allows it, and a restarted controller picks up where the records are.
Those nodes come from the fleet's index (:meth:`~gpufleet.lifecycle.fleet.Fleet.ticking`),
not from a pass over every record: at rest a tick costs what the busy nodes cost.
"""

from __future__ import annotations

from gpufleet.domain import events as ev
from gpufleet.domain.safety import breaker_refresh
from gpufleet.lifecycle import nodes
from gpufleet.lifecycle.core import ControllerCore, S
from gpufleet.lifecycle.fleet import QUIET as IDLE


class Ticks(ControllerCore):
    """``tick_all``: one Tick per non-idle node, then BMC resumes and the status save."""

    async def tick_all(self) -> None:
        """Retry held decisions and examine timeouts, node by node."""
        now = self.clock.now()
        policy = self.effective_policy()
        refreshed = breaker_refresh(
            self.fleet.breaker,
            now=now,
            config=policy.safety.breaker,
            fleet_size=self.fleet.view().size,
        )
        if refreshed != self.fleet.breaker:
            self.fleet.breaker = refreshed
            self.fleet.dirty_breaker = True
        if self.settings.ticket_webhook:  # a ticket call due again (backoff), or after a restart
            for name in list(self.fleet.records):
                self._tickets_check(name)
        for name, record in self.fleet.ticking():
            if record.state in IDLE and record.pending is None:
                if record.state is S.PROVISIONING and record.name in self.bodies:
                    body = self.bodies[name]
                    if nodes.is_ready(body):
                        await self.feed(name, ev.Tick())  # _process checks the inventory
                continue
            self._ensure_drain(record)
            await self.feed(name, ev.Tick())
        self._resume_bmc_steps()  # after the Ticks: a step they timed out is not resumed
        self._promote_spares("the pool's training capacity is short")
        await self._run_plans()
        if self.fleet.dirty_breaker:
            self._schedule_status_save()
        self._update_gauges()
        self.metrics.ticks.inc()
