"""The lifecycle controller: Node events in, ``decide()``, record first, act second.

One pass for a node (:class:`~gpufleet.lifecycle.reconcile.NodePass`), always in
this order:

1. read the Node: its record, the faults its agent reports that the record
   has not seen, the agent's answer to the request the record waits for;
2. ``decide`` each event, under the fleet lock (budget, breaker, rate limit
   see every other node's latest decision);
3. write the record, the state label, gpufleet's cordon and taints and the
   next agent request in *one* merge patch guarded by ``resourceVersion``
   (a 409 re-reads the Node and starts again);
4. only then act outside the Node (:class:`~gpufleet.lifecycle.acting.Acting`):
   drain, steps through the gate, Events, metrics, the NodeRemediation object.

The controller is composed of collaborators that own their state and are
handed only the ports they may use (docs/decisions/0140); this class builds
them and routes the watch events and the tick to them. Who can reach what:

============================  ==============================================
collaborator                  may
============================  ==============================================
``nodes`` (NodePass)          decide; write a node's record, label, cordon, taints
``acting`` (Acting)           start work after a write (it does none itself)
``drains`` (Drains)           list, evict and delete a draining node's pods
``steps`` (GatedSteps)        ask the gate for a step on a node's hardware
``boots`` (BootWatch)         ask the gate to retry a stalled boot
``policies`` (PolicyKeeper)   read the FleetPolicy, write its status
``tickets`` (Tickets)         RMA evidence and the ticket webhook
``plans`` (MaintenancePlans)  ask for nodes through the node pass (``feed``)
``spares`` (SparePool)        promote hot spares through the node pass
``remediations``              the NodeRemediation objects (read-only copies)
``device_taints``             one DeviceTaintRule per quarantined GPU (DRA)
``domains`` (DomainWatch)     feed a faulty NVLink domain's trays through the node pass
============================  ==============================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.clock import SYSTEM_CLOCK, Clock
from gpufleet.domain import events as ev
from gpufleet.domain.repeats import Repeats
from gpufleet.gate import BmcFactory, Fence, Gate, GateSettings, redfish_bmcs
from gpufleet.kubeapi import KubePort
from gpufleet.kubeapi.events import EventRecorder
from gpufleet.lifecycle import record_key
from gpufleet.lifecycle.acting import Acting
from gpufleet.lifecycle.boot_watchdog import BootWatch
from gpufleet.lifecycle.core import ControllerSettings, log
from gpufleet.lifecycle.device_taints import DeviceTaints
from gpufleet.lifecycle.domain_watch import DomainWatch
from gpufleet.lifecycle.drain_loop import Drains
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.gated_steps import GatedSteps
from gpufleet.lifecycle.maintenance import MaintenancePlans
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.nodebook import NodeBook
from gpufleet.lifecycle.policy import HoldNotices, PolicyKeeper
from gpufleet.lifecycle.reconcile import NodePass
from gpufleet.lifecycle.remediation_sync import RemediationSync
from gpufleet.lifecycle.spare_pool import SparePool
from gpufleet.lifecycle.tasks import TaskGroup
from gpufleet.lifecycle.tickets import Tickets
from gpufleet.lifecycle.ticks import Ticker

__all__ = ["Controller", "ControllerSettings"]


class Controller:
    """The lifecycle controller of one process: its collaborators, assembled."""

    def __init__(
        self,
        client: KubePort,
        settings: ControllerSettings | None = None,
        metrics: Metrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
        *,
        fence: Fence,
        bmcs: BmcFactory | None = None,
        gate_settings: GateSettings | None = None,
    ) -> None:
        """``fence``: whether this process may act (the Lease, :mod:`~gpufleet.lifecycle.
        leadership`); ``bmcs``: how BMCs are reached (Redfish unless given): only the
        gate built here holds it."""
        self.client = client
        self.settings = s = settings or ControllerSettings()
        self.metrics = m = metrics or Metrics()
        self.clock = clock
        self.tasks = TaskGroup()
        self.fleet = Fleet()
        self.book = NodeBook()
        holds = HoldNotices()
        self.events = EventSink(
            EventRecorder(client, clock=clock),
            self.tasks,
            namespace=s.event_namespace,
            clock=clock,
        )
        self.policies = PolicyKeeper(
            client,
            s,
            fleet=self.fleet,
            metrics=m,
            events=self.events,
            tasks=self.tasks,
            holds=holds,
            clock=clock,
        )
        self.nodes = NodePass(
            client,
            s,
            book=self.book,
            fleet=self.fleet,
            policies=self.policies,
            events=self.events,
            metrics=m,
            tasks=self.tasks,
            clock=clock,
        )
        feed = self.nodes.feed
        self.fence = fence
        self._taking_over = False
        """Between taking the lease and having read what the last holder left."""
        gate = Gate(
            client,
            bmcs or redfish_bmcs(retry_delays=s.bmc_retry_delays, ca_file=s.bmc_ca_file),
            fence=fence,
            keys=lambda: self.nodes.keys,
            clock=clock,
            settings=gate_settings,
        )
        self.plans = MaintenancePlans(
            client,
            book=self.book,
            fleet=self.fleet,
            policies=self.policies,
            feed=feed,
            clock=clock,
        )
        self.drains = Drains(
            client,
            book=self.book,
            fleet=self.fleet,
            policy=self.policies.effective,
            events=self.events,
            tasks=self.tasks,
            feed=feed,
            clock=clock,
            poll_s=s.drain_poll_s,
        )
        self.steps = GatedSteps(
            client,
            gate=gate,
            book=self.book,
            fleet=self.fleet,
            policies=self.policies,
            events=self.events,
            metrics=m,
            tasks=self.tasks,
            clock=clock,
            decide_bound=self.nodes.decide_bound,
            reimage_version=self.plans.reimage_version,
        )
        self.spares = SparePool(
            fleet=self.fleet, policies=self.policies, feed=feed, tasks=self.tasks
        )
        self.tickets = Tickets(
            client,
            s,
            book=self.book,
            fleet=self.fleet,
            policies=self.policies,
            events=self.events,
            metrics=m,
            tasks=self.tasks,
            clock=clock,
        )
        self.remediations = RemediationSync(client, policy=lambda: self.policies.policy)
        self.device_taints = (
            DeviceTaints(
                client,
                fleet=self.fleet,
                book=self.book,
                policy=self.policies.effective,
                events=self.events,
                clock=clock,
                may_act=self.active,
            )
            if s.device_taints
            else None
        )
        self.boots = BootWatch(
            client,
            s,
            gate=gate,
            book=self.book,
            policies=self.policies,
            events=self.events,
            metrics=m,
            clock=clock,
        )
        self.acting = Acting(
            events=self.events,
            metrics=m,
            fleet=self.fleet,
            policies=self.policies,
            holds=holds,
            drains=self.drains,
            steps=self.steps,
            spares=self.spares,
            tickets=self.tickets,
            remediations=self.remediations,
            tasks=self.tasks,
            clock=clock,
            log_repeats=Repeats(every_s=60.0),
        )
        self.nodes.acting = self.acting
        self.nodes.deleted = self._forget
        self.nodes.may_act = self.active
        self.policies.may_act = self.active
        self.domains = DomainWatch(
            fleet=self.fleet,
            book=self.book,
            rule=lambda: self.policies.effective().domain_faults,
            events=self.events,
            policy_ref=self.policies.reference,
            feed=feed,
            clock=clock,
        )
        self.policies.domain_faults = self.domains.status
        self.ticker = Ticker(
            fleet=self.fleet,
            book=self.book,
            policies=self.policies,
            drains=self.drains,
            steps=self.steps,
            spares=self.spares,
            plans=self.plans,
            tickets=self.tickets,
            metrics=m,
            feed=feed,
            clock=clock,
            domains=self.domains,
        )

    # ------------------------------------------------------------ acting or not

    def active(self) -> bool:
        """Whether this replica acts now (it holds the lease and has taken over); a
        standby keeps its caches."""
        return self.fence.holds(0.0) and not self._taking_over

    async def activate(self) -> None:
        """This replica starts acting (it took the lease): the key, then the breaker and
        rate limit re-read from the FleetPolicy status (never this process's stale
        copy), every Node listed afresh, and what arrived meanwhile decided.

        Nothing is decided until the status is read: a watch event decided meanwhile
        could trip the breaker, and the read, taken before that save landed, would then
        put the closed breaker back (the next fault isolated past an open breaker)."""
        self._taking_over = True
        try:
            await self.load_key()
            await self.policies.reload()
            await self.nodes.prime()
        finally:
            self._taking_over = False
        for _, body in self.book.items():
            await self.nodes.on_node(body)

    def deactivate(self, why: str) -> None:
        """This replica stops acting (lease lost, or stopping): every acting and restoring
        task ends now."""
        self.tasks.stop_leading(why)

    # ------------------------------------------------------------- the watches

    async def prime(self) -> None:
        """Load the signing key, then every Node's record before the first decision
        (budget needs the whole fleet). Without the key nothing is decided."""
        await self.load_key()
        await self.nodes.prime()

    async def load_key(self) -> bool:
        """The record signing key, read (or created) if not loaded yet; False: unavailable."""
        if self.nodes.keys:
            return True
        s = self.settings
        try:
            key = await record_key.load_or_create(
                self.client, s.key_namespace or s.event_namespace, s.key_secret
            )
        except record_key.KeyUnavailable as exc:
            log.error("no record can be trusted, nothing is decided: %s", exc)
            return False
        self.nodes.keys = [key]
        return True

    async def on_node(self, body: Mapping[str, Any]) -> None:
        """A Node changed (watch event)."""
        await self.nodes.on_node(body)

    def on_node_deleted(self, name: str) -> None:
        self.nodes.on_node_deleted(name)

    def _forget(self, name: str) -> None:
        self.drains.forget(name)
        self.steps.forget(name)

    async def feed(self, name: str, event: ev.Event) -> None:
        """Decide an event that did not come from the Node (drain done, step done, tick)."""
        await self.nodes.feed(name, event)

    async def on_policy(self, body: Mapping[str, Any]) -> None:
        """The FleetPolicy changed (watch event)."""
        await self.policies.on_policy(body)
        await self.nodes.regroup()

    def on_policy_deleted(self) -> None:
        """The FleetPolicy is gone: pause (fail closed)."""
        self.policies.on_deleted()

    def on_machine(self, type_: str, body: Mapping[str, Any]) -> None:
        """A Machine changed (watch event)."""
        self.boots.on_machine(type_, body)

    def on_plan(self, body: Mapping[str, Any]) -> None:
        """A MaintenancePlan changed (watch event)."""
        self.plans.on_plan(body)

    def on_plan_deleted(self, name: str) -> None:
        self.plans.on_plan_deleted(name)

    # ---------------------------------------------------------------- periodic

    async def tick_all(self) -> None:
        """Retry held decisions, examine timeouts, resume steps, move plans on."""
        if not self.active() or not await self.load_key():
            return
        await self.ticker.tick()
        if self.device_taints is not None:
            await self.device_taints.sync()

    async def watch_boots(self) -> None:
        """One pass over the Machines with a boot in progress."""
        await self.boots.watch_boots()

    async def save_fleet_status(self) -> None:
        """Persist the breaker, recent actions and budget use now."""
        await self.policies.save_fleet_status()

    async def close(self) -> None:
        await self.tasks.close()
