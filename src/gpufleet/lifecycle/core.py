"""The controller's state and plumbing, shared by the concept modules of :class:`Controller`.

:class:`ControllerCore` holds everything one controller process keeps (all of it
a cache of Kubernetes objects, rebuilt by ``prime`` after a restart), the task
and lock plumbing, and declares the few methods by which one concept calls
another (an Event, a drain, a BMC step, a status save). Each concept module
(``policy``, ``reconcile``, ``acting``, ``events``, ``drain_loop``, ``bmc_tasks``,
``ticks``, ``remediation_sync``) subclasses it; :mod:`gpufleet.lifecycle.controller`
combines them (docs/decisions/0085).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.clock import SYSTEM_CLOCK, Clock
from gpufleet.domain import events as ev
from gpufleet.domain.decide import Decision
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy, default_policy
from gpufleet.domain.records import Incident, NodeRecord
from gpufleet.domain.repeats import Repeats
from gpufleet.domain.states import NodeState
from gpufleet.kubeapi import KubePort
from gpufleet.kubeapi.events import EventRecorder
from gpufleet.lifecycle import bmc as kube_bmc
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.remediate import redfish

log = logging.getLogger("gpufleet.controller")

Json = dict[str, Any]
S = NodeState


@dataclass(frozen=True)
class ControllerSettings:
    """How the controller runs. Every field has a default suited to production."""

    policy_name: str = "default"
    """The FleetPolicy object to obey. Until it exists and is valid, nothing
    disruptive happens (fail closed)."""
    dry_run: bool = False
    """Force dry-run whatever the policy says (decide and report only)."""
    tick_s: float = 2.0
    """How often held decisions are retried and step/check timeouts examined."""
    drain_poll_s: float = 1.0
    """How often a draining node's pods are looked at."""
    event_namespace: str = "default"
    """Where Events about Nodes (cluster-scoped) are written."""
    conflict_retries: int = 8
    """Re-reads of a Node after a 409 before giving up until the next event."""
    bmc_retry_delays: tuple[float, ...] = redfish.RETRY_DELAYS
    """Pauses between attempts of one BMC request."""
    status_save_delay_s: float = 0.5
    """The FleetPolicy status (breaker, budget) is saved at most this often."""
    ticket_webhook: str | None = None
    """Where RMA tickets are opened and closed (POST, docs/schemas/rma-ticket.schema.json);
    None: no tickets, no evidence bundles (docs/decisions/0108)."""
    ticket_auth_file: str | None = None
    """A file whose content is the webhook's ``Authorization`` header (a mounted Secret)."""
    ticket_timeout_s: float = 10.0
    """Longest wait for one webhook answer."""
    ticket_retry_s: float = 5.0
    """Pause after a ticket call's first failure; it doubles with each failure..."""
    ticket_retry_max_s: float = 300.0
    """...up to this (the call is retried until the receiver acknowledges it)."""
    evidence_namespace: str | None = None
    """Where evidence bundles (ConfigMaps) are stored; None: the event namespace."""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Labels (exact values) of the Nodes the controller manages; empty: every Node. A
    cluster's CPU and system nodes (where the controller itself runs) are left alone."""
    adoption_writes_per_s: float = 50.0
    """First writes of healthy nodes gpufleet has never seen, per second (decision 0124):
    they are acted on at once and labelled at this pace; 0 writes each at once."""


def _paused_default() -> Policy:
    return default_policy().model_copy(update={"paused": True})


class ControllerCore:
    """State of one controller process (all of it a cache of Kubernetes objects)."""

    def __init__(
        self,
        client: KubePort,
        settings: ControllerSettings | None = None,
        metrics: Metrics | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        self.settings = settings or ControllerSettings()
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.event_recorder = EventRecorder(client, clock=clock)
        """Posts every Event; a repeat counts on the first one."""
        self.log_repeats = Repeats(every_s=60.0)
        """Rate-limits log lines a pass repeats (a held node is decided about every tick)."""
        from gpufleet.lifecycle.fleet import Fleet

        self.fleet = Fleet()
        self.policy: Policy = _paused_default()
        self.policy_seen = False
        self.bodies: dict[str, Json] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._bmc = kube_bmc.Runs()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._nrem_locks: dict[str, asyncio.Lock] = {}
        self._nrem_written: dict[str, Json] = {}
        """Per open NodeRemediation: the status last written (it exists; an equal status
        is not written again)."""
        self._status_saver: asyncio.Task[None] | None = None
        self._held_said: dict[str, str] = {}
        """Per node, the last hold announced by an Event (a hold retried every tick is
        announced once, not 30 times a minute)."""
        self._ticketing: set[str] = set()
        """Nodes whose ticket task runs (tickets): one call at a time per node."""
        self._ticket_said: dict[str, str] = {}
        """Per node, the last dry-run ticket Event (said once, not every tick)."""
        self._plans: dict[str, Json] = {}
        """MaintenancePlans as the watch last delivered them (maintenance)."""
        self._promoting: set[str] = set()
        """Hot spares whose promotion is under way (spare_pool)."""
        self._slurm_heard: dict[str, tuple[str | None, float]] = {}
        """Per draining node: the last Slurm report seen and when (monotonic, this process)."""
        self._drain_said: dict[str, str] = {}
        """Per draining node: what the last DrainWaiting Event said (without numbers)."""
        self.booting: dict[str, Json] = {}
        """Machines with a boot in progress, as last seen by the Machine watch (boot_watchdog)."""
        self._boot_said: dict[str, str] = {}
        """Per booting Machine: the last stall announced by an Event (announced once)."""
        self._rejoin_checked: dict[str, str] = {}
        """Per Node with a Machine: the Ready transition whose join token was looked at."""
        self.adoption_pending: dict[str, None] = {}
        """Adopted healthy nodes whose first write waits its turn, oldest first (reconcile)."""
        self._adoption_writer: asyncio.Task[None] | None = None
        """The task writing them (None: none pending, it ended)."""
        self._adopting_now: set[str] = set()
        """The node the writer is writing: its first write is not deferred again."""
        self._policy_generation: tuple[Any, Any] = (None, None)
        self._saved_budget: dict[str, Any] | None = None
        """The budget part of the last FleetPolicy status saved (saved again when it changes)."""
        self._policy_conditions: list[dict[str, Any]] | None = None
        """The FleetPolicy's status conditions as last written (None: not read yet)."""
        self._breaker_reset_done: tuple[str, float] | None = None
        """(id, at) of the last breaker reset answered: a watch event that still shows it
        (before its removal lands) is not answered twice."""

    # ------------------------------------------------------------- plumbing

    def _spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=what)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed: %s", what, t.exception())

        task.add_done_callback(done)
        return task

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def effective_policy(self) -> Policy:
        if self.settings.dry_run and not self.policy.dry_run:
            return self.policy.model_copy(update={"dry_run": True})
        return self.policy

    # ------------------------------------------------------------------ seams
    # What one concept asks of another; each is implemented in the module named.

    def _event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about a Node (events)."""
        raise NotImplementedError

    def _policy_event(self, body: Mapping[str, Any], type_: str, reason: str, msg: str) -> None:
        """An Event about the FleetPolicy (events)."""
        raise NotImplementedError

    def _machine_event(self, body: Mapping[str, Any], type_: str, reason: str, msg: str) -> None:
        """An Event about a Machine (events)."""
        raise NotImplementedError

    def _reimage_version(self, name: str) -> str | None:
        """The image version the node's reimage installs, if a plan names one (maintenance)."""
        raise NotImplementedError

    def _update_gauges(self) -> None:
        """Fleet gauges, and a status save when the budget use changed (policy)."""
        raise NotImplementedError

    def _schedule_status_save(self) -> None:
        """Save the FleetPolicy status soon, coalescing bursts (policy)."""
        raise NotImplementedError

    async def feed(self, name: str, event: ev.Event) -> None:
        """Decide an event that did not come from the Node (reconcile)."""
        raise NotImplementedError

    async def _reconcile(self, body: Json, *, extra: Sequence[ev.Event]) -> None:
        """One node pass, retried on conflicts (reconcile)."""
        raise NotImplementedError

    def _after(
        self,
        original: Json,
        body: Json,
        before: NodeRecord,
        record: NodeRecord,
        decisions: Sequence[Decision],
        now: float,
    ) -> None:
        """Act on what was just recorded (acting)."""
        raise NotImplementedError

    def _ensure_drain(self, record: NodeRecord) -> None:
        """Start the node's drain task if it should run and does not (drain_loop)."""
        raise NotImplementedError

    def _promote_spares(self, why: str) -> None:
        """Promote the hot spares the pools need now (spare_pool)."""
        raise NotImplementedError

    async def _run_plans(self) -> None:
        """Move every MaintenancePlan on: batches, progress, status (maintenance)."""
        raise NotImplementedError

    def _tickets_check(self, name: str) -> None:
        """Start the node's RMA ticket work if its ticket needs any now (tickets)."""
        raise NotImplementedError

    def _run_bmc_step(self, body: Mapping[str, Any], step: Step) -> Coroutine[Any, Any, None]:
        """The task for a BMC step just recorded as started (bmc_tasks)."""
        raise NotImplementedError

    def _resume_bmc_steps(self) -> None:
        """Take up BMC attempts in progress that no task here runs (bmc_tasks)."""
        raise NotImplementedError

    async def _sync_remediation(self, record: NodeRecord, incident: Incident, now: float) -> None:
        """Create or update the incident's NodeRemediation (remediation_sync)."""
        raise NotImplementedError
