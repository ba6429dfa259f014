"""Operator requests: a person's verb on a node, and the controller's answer.

``gpufleet node return|triage|rma|maintenance|dismiss NODE --reason TEXT`` does
not change the node: it writes an :class:`OperatorRequest` on the Node
(:data:`~gpufleet.domain.well_known.ANNOTATION_OPERATOR_REQUEST`). The lifecycle
controller turns it into an event (:func:`event_for`), decides it like any other
event (the state table, pause, dry-run, the disruption budget) and answers with
:func:`answer`. Keeping the verb a request, not an action, is what gives it an
audit trail and keeps one brain deciding (docs/decisions/0075).

:func:`refusal` is the one place that says which verb is legal in which state;
the handlers in :mod:`gpufleet.domain.decide` use it too, so the answer the
operator reads and what ``decide`` did cannot disagree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import events as ev
from gpufleet.domain import well_known
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState, Transition

S = NodeState

VERBS = ("return", "triage", "rma", "maintenance", "dismiss")
"""Every verb ``gpufleet node`` accepts."""

MAX_REASON = 500
"""Longest reason kept (it travels in annotations, Events and the record)."""


class RequestError(ValueError):
    """The annotation is not a request gpufleet understands (the message says why)."""


@dataclass(frozen=True, slots=True)
class OperatorRequest:
    """What a person asked, who they are (as the apiserver told the CLI) and when."""

    verb: str
    reason: str
    by: str
    at: float
    id: str
    hardware_replaced: bool = False
    """``return`` of a node in ``rma``: the vendor replaced the hardware."""

    @property
    def text(self) -> str:
        """The reason as it is recorded: ``by <user>: <reason>``."""
        return f"by {self.by}: {self.reason}"

    def encode(self) -> str:
        data: dict[str, Any] = {
            "verb": self.verb,
            "reason": self.reason,
            "by": self.by,
            "at": self.at,
            "id": self.id,
        }
        if self.hardware_replaced:
            data["hardwareReplaced"] = True
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> OperatorRequest:
        """Parse an annotation value; raise :class:`RequestError` saying what is wrong."""
        try:
            data = json.loads(text)
        except ValueError:
            raise RequestError("not JSON") from None
        if not isinstance(data, dict):
            raise RequestError("not a JSON object")
        verb = data.get("verb")
        if verb not in VERBS:
            raise RequestError(f"unknown verb {verb!r} (known: {', '.join(VERBS)})")
        reason = data.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise RequestError("a request needs a reason")
        by = data.get("by")
        if not isinstance(by, str) or not by.strip():
            raise RequestError("a request needs the user who made it (by)")
        at = data.get("at")
        if not isinstance(at, int | float) or isinstance(at, bool):
            raise RequestError("a request needs a time (at, seconds since the epoch)")
        rid = data.get("id")
        return cls(
            verb=verb,
            reason=reason.strip()[:MAX_REASON],
            by=by.strip()[:200],
            at=float(at),
            id=str(rid or "")[:64] or "-",
            hardware_replaced=data.get("hardwareReplaced") is True,
        )


def event_for(request: OperatorRequest) -> ev.Event:
    """The event ``decide`` gets for a request (its reason says who and why)."""
    text = request.text
    if request.verb == "return":
        return ev.HardwareReplaced(text) if request.hardware_replaced else ev.OperatorReturn(text)
    if request.verb == "triage":
        return ev.OperatorTriage(text)
    if request.verb == "rma":
        return ev.OperatorRMA(text)
    if request.verb == "maintenance":
        return ev.MaintenanceRequested(text)
    return ev.OperatorDismiss(text)


_RETURNABLE = frozenset({S.TRIAGE, S.MAINTENANCE})
_TRIAGEABLE = frozenset(
    {S.PRODUCTION, S.DRAINING, S.REMEDIATING, S.VERIFYING, S.MAINTENANCE, S.PROVISIONING, S.BURN_IN}
)
_TO_RMA = frozenset({S.TRIAGE, S.MAINTENANCE})
_TO_MAINTENANCE = frozenset({S.PRODUCTION, S.PROVISIONING, S.BURN_IN, S.TRIAGE})


def refusal(record: NodeRecord, event: ev.Event) -> str | None:
    """Why this operator event cannot be carried out on this node, or None if it can.

    Only operator events are judged; any other event gets None.
    """
    state = record.state
    if isinstance(event, ev.OperatorReturn):
        if state is S.RMA:
            return (
                "a node in rma returns only when its hardware was replaced "
                "(gpufleet node return NODE --hardware-replaced)"
            )
        if state not in _RETURNABLE:
            return f"return needs a node in triage or maintenance; it is in {state}"
        return None
    if isinstance(event, ev.HardwareReplaced):
        if state is not S.RMA:
            return f"a hardware replacement applies to a node in rma; it is in {state}"
        return None
    if isinstance(event, ev.OperatorTriage):
        if state is S.TRIAGE:
            return "the node is already in triage"
        if state not in _TRIAGEABLE:
            return f"triage is not possible from {state}"
        return None
    if isinstance(event, ev.OperatorRMA):
        if state not in _TO_RMA:
            return f"rma needs a node in triage or maintenance; it is in {state}"
        return None
    if isinstance(event, ev.MaintenanceRequested):
        if state not in _TO_MAINTENANCE:
            allowed = ", ".join(sorted(_TO_MAINTENANCE))
            return f"maintenance needs a node in {allowed}; it is in {state}"
        return None
    if isinstance(event, ev.OperatorDismiss):
        if record.pending is None:
            return "no fault is held on this node: nothing to dismiss"
        return None
    return None


@dataclass(frozen=True, slots=True)
class Received:
    """What the controller read from the annotation: a request and its event, or a problem."""

    request: OperatorRequest | None
    event: ev.Event | None
    problem: str | None = None


def receive(text: str) -> Received:
    """Read an annotation value: a request and its event, or why it was not understood."""
    try:
        request = OperatorRequest.decode(text)
    except RequestError as exc:
        return Received(request=None, event=None, problem=str(exc))
    return Received(request=request, event=event_for(request))


def answer(
    received: Received,
    before: NodeRecord,
    *,
    held: str | None,
    transition: Transition | None,
    reasons: tuple[str, ...],
) -> tuple[bool, str]:
    """Whether the request was carried out, and the Event message that says so.

    ``before`` is the record the event was decided on; ``held`` the rail that
    withheld the decision (``Hold`` value) or None; ``transition`` and
    ``reasons`` come from the decision.
    """
    req = received.request
    if req is None or received.event is None:
        problem = received.problem or "unreadable"
        return (
            False,
            f"refused: {well_known.ANNOTATION_OPERATOR_REQUEST} is not a request: {problem}",
        )
    head = f"[{req.id}] {req.verb} by {req.by}"
    why = refusal(before, received.event)
    if why is not None:
        return False, f"{head}: refused: {why} (reason given: {req.reason})"
    if held is not None:
        text = "; ".join(r for r in reasons if r.startswith("held:")) or held
        return False, f"{head}: refused: {text} (reason given: {req.reason})"
    if transition is not None:
        move = f"{transition.source} -> {transition.target}"
        return True, f"{head}: accepted: {move}: {req.reason}"
    detail = "; ".join(reasons) or req.reason
    return True, f"{head}: accepted: {detail}"
