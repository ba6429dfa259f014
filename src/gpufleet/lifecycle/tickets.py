"""The RMA hand-off: an evidence bundle and a ticket for every node handed to people.

When a node reaches ``triage`` or ``rma`` its evidence (incident, fault history,
check results, kernel log lines, inventory, lemon score) is stored in a ConfigMap
and a ticket is opened through the webhook (``--ticket-webhook``); when the
hardware was replaced (``gpufleet machines rearm`` writes ``gpufleet.io/rma-close``
on the Node) or the node leaves the hand-off, the ticket is closed.

What to do is :func:`gpufleet.domain.rma.advance`'s decision; here it is carried
out, one task per node, record before act: the ticket record on the Node
(``gpufleet.io/rma-ticket``) is written with the attempt counted and the next try
scheduled *before* each call, and the call is not made if that write fails. A
lost answer, a 5xx or a restart leaves ``opening`` on the Node, and the next try
(after the backoff, by whichever controller runs then) sends the same idempotency
key: one ticket, never none (docs/decisions/0109).

Dry-run sends nothing and says once, in an Event, what it would send; pause holds
every call until it ends (docs/decisions/0108).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet.clock import Clock
from gpufleet.domain import node_reports, rma, well_known
from gpufleet.domain import rma_payload as payloads
from gpufleet.domain.records import NodeRecord
from gpufleet.kubeapi import NODES, ApiError, Conflict, NotFound
from gpufleet.kubeapi.events import from_agent_of
from gpufleet.kubeapi.machines import MACHINES
from gpufleet.kubeapi.resources import CONFIGMAPS, EVENTS
from gpufleet.lifecycle import machines, nodes
from gpufleet.lifecycle.core import ControllerSettings, Json, log
from gpufleet.lifecycle.events import EventSink
from gpufleet.lifecycle.fleet import Fleet
from gpufleet.lifecycle.metrics import Metrics
from gpufleet.lifecycle.nodebook import NodeBook
from gpufleet.lifecycle.policy import PolicyKeeper
from gpufleet.lifecycle.ports import WritePort
from gpufleet.lifecycle.tasks import TaskGroup
from gpufleet.remediate.ticket_webhook import TicketWebhook

MAX_IN_FLIGHT = 4
"""Nodes whose ticket work runs at once: a controller that starts with many nodes already in
triage (tickets just turned on) opens their tickets a few at a time, the next tick going on
with the rest, instead of flooding the receiver."""
_ROUNDS = 4
"""Passes of one task: the ticket record settles in at most two writes, then one call."""
_VERBS = {"opened": "open", "updated": "update", "closed": "close"}
"""The verb of each webhook event (dry-run's Events: TicketWouldOpen, ...)."""
MAX_AGENT_EVENTS = 50
"""The agent's Events on the node read for the kernel log excerpt (the newest)."""


def _epoch(value: Any) -> float:
    """An Event's RFC 3339 time as epoch seconds (0 when absent or unreadable: sorted first)."""
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _annotations(body: Mapping[str, Any]) -> Mapping[str, str]:
    return body.get("metadata", {}).get("annotations") or {}


class Tickets:
    """``check``: the node's ticket opened, retried, closed or forgotten."""

    def __init__(
        self,
        client: WritePort,
        settings: ControllerSettings,
        *,
        book: NodeBook,
        fleet: Fleet,
        policies: PolicyKeeper,
        events: EventSink,
        metrics: Metrics,
        tasks: TaskGroup,
        clock: Clock,
    ) -> None:
        self.client = client
        self.settings = settings
        self.book = book
        self.fleet = fleet
        self.policies = policies
        self.events = events
        self.metrics = metrics
        self.tasks = tasks
        self.clock = clock
        self._ticketing: set[str] = set()
        """Nodes whose ticket task runs: one call at a time per node."""
        self._ticket_said: dict[str, str] = {}
        """Per node, the last dry-run ticket Event (said once, not every tick)."""

    @property
    def enabled(self) -> bool:
        """Whether tickets are opened at all (a webhook is configured)."""
        return bool(self.settings.ticket_webhook)

    def check(self, name: str) -> None:
        if not self.settings.ticket_webhook or name in self._ticketing:
            return
        if len(self._ticketing) >= MAX_IN_FLIGHT:
            return  # the next tick asks again
        body, record = self.book.get(name), self.fleet.records.get(name)
        if body is None or record is None:
            return
        ann = _annotations(body)
        text, close_text = (
            ann.get(well_known.ANNOTATION_RMA_TICKET),
            ann.get(well_known.ANNOTATION_RMA_CLOSE),
        )
        if record.state not in rma.HANDOFF_STATES and text is None and close_text is None:
            return
        ticket, close = rma.decode_ticket(text), rma.decode_close(close_text)
        wanted = rma.advance(ticket, record, close)
        now = self.clock.now()
        if wanted == ticket and close_text is None and not rma.due(wanted, now):
            return
        policy = self.policies.effective()
        if policy.dry_run:
            self._say_dry_run(body, wanted)
            return
        if policy.paused:
            return
        self._ticketing.add(name)
        task = self.tasks.spawn(self._ticket_work(name), f"ticket {name}", acting=True)
        task.add_done_callback(lambda _t: self._ticketing.discard(name))

    def _say_dry_run(self, body: Mapping[str, Any], wanted: rma.Ticket | None) -> None:
        """One Event per ticket and event that dry-run keeps from being sent."""
        if wanted is None or wanted.state not in rma.PENDING:
            return
        name = nodes.name_of(body)
        event = rma.event_of(wanted)
        said = f"{wanted.key}#{event}"
        if self._ticket_said.get(name) == said:
            return
        self._ticket_said[name] = said
        verb = _VERBS[event]
        self.events.node(
            body,
            "Normal",
            f"TicketWould{verb.capitalize()}",
            f"dry-run: would {verb} RMA ticket {wanted.key} (nothing sent, no evidence stored)",
        )

    # ------------------------------------------------------------------ the task

    async def _ticket_work(self, name: str) -> None:
        """Settle the ticket record, then make at most one call (bounded: ``_ROUNDS``)."""
        for _ in range(_ROUNDS):
            try:
                body = await self.client.get(NODES, name)
            except NotFound:
                return
            except ApiError as exc:
                log.warning("node=%s ticket waits, Node not read: %s", name, exc)
                return
            now = self.clock.now()
            record, _ = nodes.record_of(body, now)
            ann = _annotations(body)
            ticket = rma.decode_ticket(ann.get(well_known.ANNOTATION_RMA_TICKET))
            close_text = ann.get(well_known.ANNOTATION_RMA_CLOSE)
            wanted = rma.advance(ticket, record, rma.decode_close(close_text))
            if wanted != ticket or close_text is not None:
                if not await self._settle(body, ticket, wanted, clear_close=close_text is not None):
                    return
                continue
            if wanted is not None and rma.due(wanted, now):
                await self._attempt(body, record, wanted, now)
            return

    async def _settle(
        self,
        body: Json,
        ticket: rma.Ticket | None,
        wanted: rma.Ticket | None,
        *,
        clear_close: bool,
    ) -> bool:
        """Store what the ticket became (and drop the evidence of a ticket left behind)."""
        name = nodes.name_of(body)
        if ticket is not None and (wanted is None or wanted.key != ticket.key):
            # The stored reference, else the ConfigMap an opening attempt may have stored
            # before a crash kept its name from the record (the name is derived: the same).
            ns, cm = self._evidence_namespace(), payloads.evidence_name(ticket.key, name)
            if ticket.evidence or ticket.sent:
                await self._drop_evidence(name, ticket.evidence or f"{ns}/{cm}")
        if not await self._write_ticket(name, wanted, clear_close=clear_close):
            return False
        if (
            wanted is not None
            and wanted.state is rma.TicketState.CLOSED
            and (ticket is None or ticket.state is not rma.TicketState.CLOSED)
        ):
            self.events.node(body, "Normal", "TicketClosed", f"{wanted.key}: {wanted.close_reason}")
        return True

    async def _write_ticket(
        self, name: str, ticket: rma.Ticket | None, *, clear_close: bool
    ) -> bool:
        """The ticket record on the Node (a merge patch of gpufleet's own two keys)."""
        values: dict[str, str | None] = {
            well_known.ANNOTATION_RMA_TICKET: rma.encode_ticket(ticket) if ticket else None
        }
        if clear_close:
            values[well_known.ANNOTATION_RMA_CLOSE] = None
        try:
            await self.client.patch(NODES, name, {"metadata": {"annotations": values}})
        except ApiError as exc:
            log.warning("node=%s ticket record not written, no call made: %s", name, exc)
            return False
        return True

    async def _attempt(
        self, body: Json, record: NodeRecord, ticket: rma.Ticket, now: float
    ) -> None:
        """One call: counted on the Node first, then sent, then its outcome stored."""
        name = record.name
        s = self.settings
        counted = rma.attempted(
            ticket,
            now,
            base_s=s.ticket_retry_s,
            max_s=s.ticket_retry_max_s,
            state=record.state.value,
        )
        if not await self._write_ticket(name, counted, clear_close=False):
            return
        event = rma.event_of(counted)
        machine = await self._machine_info(body)
        if counted.state is rma.TicketState.OPENING:
            try:
                bundle, ref = await self._evidence(body, record, counted, machine, now)
            except ApiError as exc:
                why = f"evidence not stored: {exc}"[:300]
                await self._write_ticket(name, rma.failed(counted, why), clear_close=False)
                self._ticket_failed(body, event, why)
                return
            counted = replace(counted, evidence=f"{ref.namespace}/{ref.name}")
            payload = payloads.opened(counted, record, bundle=bundle, evidence=ref, now=now)
        elif counted.state is rma.TicketState.UPDATING:
            ref_ = payloads.evidence_ref(counted.evidence)
            payload = payloads.updated(counted, record, machine=machine, evidence=ref_, now=now)
        else:
            ref_ = payloads.evidence_ref(counted.evidence)
            payload = payloads.closed(counted, record, machine=machine, evidence=ref_, now=now)
        webhook = TicketWebhook(
            str(s.ticket_webhook),
            auth_file=Path(s.ticket_auth_file) if s.ticket_auth_file else None,
            timeout_s=s.ticket_timeout_s,
        )
        delivery = await webhook.send(payloads.payload_json(payload))
        self.metrics.tickets.labels(event=event, result="ok" if delivery.ok else "failed").inc()
        if not delivery.ok:
            await self._write_ticket(name, rma.failed(counted, delivery.error), clear_close=False)
            self._ticket_failed(body, event, delivery.error)
            return
        done = rma.delivered(counted, self.clock.now(), delivery.ticket_id)
        await self._write_ticket(name, done, clear_close=False)
        which = f" (ticket {done.ticket_id})" if done.ticket_id else ""
        if event == "opened":
            detail = f"RMA ticket {done.key}{which} opened; evidence in ConfigMap {done.evidence}"
            self.events.node(body, "Normal", "TicketOpened", detail)
        elif event == "updated":
            detail = f"RMA ticket {done.key}{which} told the node is now in {done.reported}"
            self.events.node(body, "Normal", "TicketUpdated", detail)
        else:
            self.events.node(
                body, "Normal", "TicketClosed", f"{done.key}{which}: {done.close_reason}"
            )
        log.info("node=%s RMA ticket %s %s%s", name, done.key, event, which)

    def _ticket_failed(self, body: Json, event: str, why: str) -> None:
        self.events.node(
            body,
            "Warning",
            "TicketNotDelivered",
            f"ticket {event} not delivered: {why}; retried with backoff "
            f"(attempts in the {well_known.ANNOTATION_RMA_TICKET} annotation)",
        )

    # ------------------------------------------------------------------ evidence

    def _evidence_namespace(self) -> str:
        return self.settings.evidence_namespace or self.settings.event_namespace

    async def _evidence(
        self,
        body: Json,
        record: NodeRecord,
        ticket: rma.Ticket,
        machine: payloads.MachineInfo | None,
        now: float,
    ) -> tuple[payloads.Bundle, payloads.EvidenceRef]:
        """The ticket's bundle: the one stored by an earlier attempt, else collected and
        stored now (every attempt of a ticket carries the same evidence)."""
        ns = self._evidence_namespace()
        cm = payloads.evidence_name(ticket.key, record.name)
        ref = payloads.EvidenceRef(namespace=ns, name=cm)
        with contextlib.suppress(NotFound):
            stored = await self.client.get(CONFIGMAPS, cm, namespace=ns)
            text = (stored.get("data") or {}).get(ref.key)
            if text:
                with contextlib.suppress(ValueError):
                    return payloads.Bundle.model_validate_json(text), ref
        facts = payloads.NodeFacts(
            record=record,
            conditions=tuple((body.get("status") or {}).get("conditions") or ()),
            answer=node_reports.answer_of(body),
            agent_events=await self._agent_events(record.name),
            machine=machine,
        )
        bundle = payloads.collect(facts, now)
        manifest = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": cm,
                "namespace": ns,
                "labels": {
                    well_known.LABEL_EVIDENCE: "rma",
                    well_known.LABEL_EVIDENCE_NODE: record.name,
                    well_known.LABEL_MANAGED_BY: well_known.CONTROLLER,
                },
                "annotations": {well_known.ANNOTATION_RMA_TICKET: ticket.key},
            },
            "data": {ref.key: payloads.bundle_json(bundle)},
        }
        try:
            await self.client.create(CONFIGMAPS, manifest, namespace=ns)
        except Conflict:
            data = {"data": manifest["data"]}
            await self.client.patch(CONFIGMAPS, cm, data, namespace=ns)
        return bundle, ref

    async def _drop_evidence(self, node: str, ref: str) -> None:
        found = payloads.evidence_ref(ref)
        if found is None:
            return
        try:
            await self.client.delete(CONFIGMAPS, found.name, namespace=found.namespace)
        except NotFound:
            pass
        except ApiError as exc:
            log.warning("node=%s evidence %s not deleted: %s", node, ref, exc)

    async def _agent_events(self, node: str) -> tuple[payloads.AgentEvent, ...]:
        """The agent's Warning Events about the node (the fault lines it saw), newest last.

        Only the node's own agent's: an Event another account posted, or another node's
        agent, claiming to have seen something on this node is no evidence about it
        (kubeapi.events.from_agent_of; the agent-events admission policy holds agents to
        their own node)."""
        try:
            found = await self.client.list(
                EVENTS,
                namespace=self.settings.event_namespace,
                field_selector=f"involvedObject.name={node},type=Warning",
            )
        except ApiError as exc:
            log.warning("node=%s agent Events not read for the evidence: %s", node, exc)
            return ()
        out: list[payloads.AgentEvent] = []
        for e in found.items:
            if not from_agent_of(e, node, agent=well_known.AGENT):
                continue
            at = _epoch(e.get("lastTimestamp") or e.get("eventTime"))
            out.append(payloads.AgentEvent(at, str(e.get("reason", "")), str(e.get("message", ""))))
        out.sort(key=lambda e: e.at)
        return tuple(out[-MAX_AGENT_EVENTS:])

    async def _machine_info(self, body: Json) -> payloads.MachineInfo | None:
        """The inventory of the node's Machine (serial, BMC); the agent's hardware report."""
        hardware = _annotations(body).get(well_known.ANNOTATION_HARDWARE)
        name = machines.machine_of(body)
        if name is None:
            return payloads.MachineInfo(hardware=hardware) if hardware else None
        try:
            machine = await self.client.get(MACHINES, name)
        except ApiError as exc:
            log.warning(
                "node=%s Machine %s not read for the ticket: %s", nodes.name_of(body), name, exc
            )
            return payloads.MachineInfo(name=name, hardware=hardware)
        spec = machine.get("spec") or {}
        return payloads.MachineInfo(
            name=name,
            serial=spec.get("serial"),
            bmc_endpoint=(spec.get("bmc") or {}).get("endpoint"),
            hardware=hardware,
        )
