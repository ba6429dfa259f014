"""The RMA hand-off's decisions: which ticket a node needs, when to try again, what comes next.

When a node reaches ``triage`` or ``rma`` a person (and often a vendor) takes over.
gpufleet opens one ticket for that hand-off through a webhook and closes it when
the hardware was replaced (``gpufleet machines rearm``) or the node left the
hand-off. This module decides, without I/O:

- the ticket's identity (:func:`ticket_key`): one per node and incident, stable
  across controller restarts, so a repeated delivery is recognised by the receiver;
- the ticket record kept on the Node (annotation ``gpufleet.io/rma-ticket``,
  :class:`Ticket`), written *before* every attempt (the attempt count and the time
  of the next try), so a restart, a 5xx or a timeout neither opens a second ticket
  nor loses one (docs/decisions/0109);
- what the ticket must become now (:func:`advance`): opened, updated (triage to rma),
  closed, forgotten;
- the bounded backoff between attempts (:func:`retry_delay`).

The lifecycle controller carries these out (``gpufleet.lifecycle.tickets``); the
payload and the evidence bundle are :mod:`gpufleet.domain.rma_payload`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState

HANDOFF_STATES = frozenset({NodeState.TRIAGE, NodeState.RMA})
"""States in which a node is handed to people, and so has a ticket."""

MAX_TEXT = 300
"""Longest error, reason or name text kept in a ticket record."""


class TicketState(StrEnum):
    """Where a ticket is, as the Node's record of it says."""

    OPENING = "opening"
    """To be delivered. An attempt may have gone out with its answer lost; the next
    attempt sends the same idempotency key, so the receiver opens one ticket."""
    OPEN = "open"
    """The receiver acknowledged it (2xx)."""
    UPDATING = "updating"
    """The node moved within the hand-off (triage to rma): the receiver is to be told."""
    CLOSING = "closing"
    """The close is to be delivered."""
    CLOSED = "closed"
    """The receiver acknowledged the close, or the ticket was never sent. Kept while
    the node stays in the same hand-off, so it is not opened again."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """The ticket record on the Node: what was sent, what the receiver said, what is next."""

    key: str
    """The ticket's identity (:func:`ticket_key`); the idempotency key is derived from it."""
    state: TicketState
    attempts: int = 0
    """Attempts of the delivery under way (open or close), counted before each is sent."""
    next_at: float = 0.0
    """Earliest time (epoch seconds) of the next attempt."""
    sent: bool = False
    """Whether an open attempt ever went out (its answer may have been lost)."""
    ticket_id: str | None = None
    """The receiver's id for the ticket, if its answer named one."""
    evidence: str | None = None
    """``namespace/name`` of the ConfigMap that holds the evidence bundle."""
    opened_at: float | None = None
    closed_at: float | None = None
    last_error: str = ""
    """Why the last attempt failed (empty after a success)."""
    close_reason: str = ""
    close_by: str = ""
    reported: str = ""
    """The node state the last opening or update attempt sent (``triage``, ``rma``)."""


LIVE = frozenset({TicketState.OPENING, TicketState.OPEN, TicketState.UPDATING})
"""States of a ticket the receiver holds open (or is about to)."""
PENDING = frozenset({TicketState.OPENING, TicketState.UPDATING, TicketState.CLOSING})
"""States with a call to deliver."""


@dataclass(frozen=True, slots=True)
class CloseRequest:
    """A person's word that the hardware was replaced (annotation ``gpufleet.io/rma-close``,
    written by ``gpufleet machines rearm``)."""

    by: str
    reason: str
    at: float


def ticket_key(record: NodeRecord) -> str | None:
    """The identity of the ticket the node needs now; None when it needs none.

    One ticket per node and incident: ``<node>/<incident key>/<opened at>``. A node
    that moves from triage to rma keeps its incident, and so its ticket. A node
    handed off without an incident (an operator's rma of a node in burn-in) is keyed
    by the time it entered the hand-off.
    """
    if record.state not in HANDOFF_STATES:
        return None
    inc = record.incident
    if inc is not None:
        return f"{record.name}/{inc.key}/{int(inc.opened_at)}"
    return f"{record.name}/handoff/{int(handoff_since(record))}"


def handoff_since(record: NodeRecord) -> float:
    """When the node entered the hand-off it is in (triage and rma count as one)."""
    since = record.since
    for t in reversed(record.history):
        if t.target not in HANDOFF_STATES:
            break
        since = t.at
        if t.source not in HANDOFF_STATES:
            break
    return since


def idempotency_key(ticket_key_: str, event: str, state: str = "") -> str:
    """What the receiver deduplicates a delivery by: one per ticket and event (opened,
    updated to a state, closed), the same on every attempt."""
    return f"{ticket_key_}#{event}" + (f"-{state}" if event == "updated" and state else "")


def retry_delay(attempt: int, *, base_s: float, max_s: float) -> float:
    """Seconds before attempt ``attempt + 1`` after attempt ``attempt`` failed: doubling
    from ``base_s``, never more than ``max_s`` (a receiver that is down for a day is
    asked every ``max_s``, not hammered, and not given up on)."""
    if attempt < 1:
        return 0.0
    return float(min(max_s, base_s * 2.0 ** min(attempt - 1, 30)))


def _closing(ticket: Ticket, reason: str, by: str) -> Ticket:
    """The ticket with its close to deliver (a ticket never sent is closed without a call)."""
    if ticket.state is TicketState.OPENING and not ticket.sent:
        return replace(
            ticket,
            state=TicketState.CLOSED,
            attempts=0,
            next_at=0.0,
            close_reason=(reason + " (never sent: nothing to close)")[:MAX_TEXT],
            close_by=by[:MAX_TEXT],
            last_error="",
        )
    return replace(
        ticket,
        state=TicketState.CLOSING,
        attempts=0,
        next_at=0.0,
        close_reason=reason[:MAX_TEXT],
        close_by=by[:MAX_TEXT],
        last_error="",
    )


def advance(ticket: Ticket | None, record: NodeRecord, close: CloseRequest | None) -> Ticket | None:
    """The ticket record as it must be now, before any attempt; None: no record at all.

    - a node in the hand-off without a ticket gets one to open;
    - a close request closes the open ticket (one never sent is just closed);
    - a node that moved within the hand-off (triage to rma) has the receiver told;
    - a node that left the hand-off, or began a new incident in it, has its ticket
      closed first, then forgotten (and a new one opened for the new incident);
    - a closed ticket of the current hand-off stays, so nothing is opened twice.
    """
    key = ticket_key(record)
    if ticket is None:
        if key is None:
            return None
        fresh = Ticket(key=key, state=TicketState.OPENING)
        if close is not None:
            return _closing(fresh, close.reason, close.by)
        return fresh
    current = ticket.key == key
    live = ticket.state in LIVE
    if live and close is not None:
        return _closing(ticket, close.reason, close.by)
    if live and not current:
        why = (
            f"the node left {'/'.join(sorted(HANDOFF_STATES))}: {record.state}, {record.reason}"
            if key is None
            else "a new incident replaced it"
        )
        return _closing(ticket, why, "gpufleet-controller")
    if ticket.state is TicketState.CLOSED and not current:
        return Ticket(key=key, state=TicketState.OPENING) if key is not None else None
    if ticket.state is TicketState.OPEN and ticket.reported != record.state.value:
        return replace(ticket, state=TicketState.UPDATING, attempts=0, next_at=0.0)
    return ticket


def due(ticket: Ticket | None, now: float) -> bool:
    """Whether a delivery is to be attempted now."""
    return ticket is not None and ticket.state in PENDING and ticket.next_at <= now


def attempted(
    ticket: Ticket, now: float, *, base_s: float, max_s: float, state: str = ""
) -> Ticket:
    """The record to store *before* an attempt: counted, and the next try scheduled
    (so a crash during the call retries after the backoff, not at once). ``state`` is the
    node state the call reports (kept as :attr:`Ticket.reported` by openings and updates)."""
    n = ticket.attempts + 1
    reports = ticket.state in (TicketState.OPENING, TicketState.UPDATING)
    return replace(
        ticket,
        attempts=n,
        next_at=now + retry_delay(n, base_s=base_s, max_s=max_s),
        sent=ticket.sent or ticket.state is TicketState.OPENING,
        reported=state if reports and state else ticket.reported,
    )


def delivered(ticket: Ticket, now: float, ticket_id: str | None) -> Ticket:
    """The record after the receiver acknowledged the attempt."""
    if ticket.state is TicketState.UPDATING:
        return replace(ticket, state=TicketState.OPEN, attempts=0, next_at=0.0, last_error="")
    if ticket.state is TicketState.OPENING:
        return replace(
            ticket,
            state=TicketState.OPEN,
            attempts=0,
            next_at=0.0,
            opened_at=now,
            ticket_id=(ticket_id or ticket.ticket_id),
            last_error="",
        )
    return replace(
        ticket, state=TicketState.CLOSED, attempts=0, next_at=0.0, closed_at=now, last_error=""
    )


def failed(ticket: Ticket, error: str) -> Ticket:
    """The record after an attempt failed (its next try is already scheduled)."""
    return replace(ticket, last_error=error[:MAX_TEXT])


def event_of(ticket: Ticket) -> str:
    """The webhook event an attempt of this ticket sends."""
    if ticket.state is TicketState.CLOSING:
        return "closed"
    return "updated" if ticket.state is TicketState.UPDATING else "opened"


# ------------------------------------------------------------------ annotations


def encode_ticket(ticket: Ticket) -> str:
    data: dict[str, Any] = {
        "key": ticket.key,
        "state": ticket.state.value,
        "attempts": ticket.attempts,
        "nextAt": ticket.next_at,
        "sent": ticket.sent,
    }
    optional = {
        "ticketId": ticket.ticket_id,
        "evidence": ticket.evidence,
        "openedAt": ticket.opened_at,
        "closedAt": ticket.closed_at,
        "lastError": ticket.last_error or None,
        "closeReason": ticket.close_reason or None,
        "closeBy": ticket.close_by or None,
        "reported": ticket.reported or None,
    }
    data.update({k: v for k, v in optional.items() if v is not None})
    return json.dumps(data, separators=(",", ":"))


def _opt_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _opt_str(value: object) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) and value else None


def decode_ticket(text: str | None) -> Ticket | None:
    """The ticket record in an annotation; None if absent or malformed (the caller then
    opens one: the receiver's idempotency key keeps that from being a second ticket)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        key, state = data["key"], TicketState(data["state"])
    except (ValueError, TypeError, KeyError):
        return None
    attempts = data.get("attempts", 0)
    if not isinstance(key, str) or not key or not isinstance(attempts, int) or attempts < 0:
        return None
    return Ticket(
        key=key,
        state=state,
        attempts=attempts,
        next_at=_opt_float(data.get("nextAt")) or 0.0,
        sent=data.get("sent") is True,
        ticket_id=_opt_str(data.get("ticketId")),
        evidence=_opt_str(data.get("evidence")),
        opened_at=_opt_float(data.get("openedAt")),
        closed_at=_opt_float(data.get("closedAt")),
        last_error=_opt_str(data.get("lastError")) or "",
        close_reason=_opt_str(data.get("closeReason")) or "",
        close_by=_opt_str(data.get("closeBy")) or "",
        reported=_opt_str(data.get("reported")) or "",
    )


def encode_close(request: CloseRequest) -> str:
    return json.dumps(
        {"by": request.by[:MAX_TEXT], "reason": request.reason[:MAX_TEXT], "at": request.at},
        separators=(",", ":"),
    )


def decode_close(text: str | None) -> CloseRequest | None:
    """A close request; None if absent or malformed (a malformed one is dropped, not obeyed)."""
    if not text:
        return None
    try:
        data = json.loads(text)
        by, reason, at = data["by"], data["reason"], data["at"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(by, str) or not isinstance(reason, str) or _opt_float(at) is None:
        return None
    return CloseRequest(by=by[:MAX_TEXT], reason=reason[:MAX_TEXT], at=float(at))
