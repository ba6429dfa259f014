"""The RMA ticket webhook client: one POST per attempt, nothing retried here.

The retry loop is the controller's (``gpufleet.lifecycle.tickets``): it counts each
attempt on the Node *before* calling :meth:`TicketWebhook.send`, so a retry after a
restart is the same attempt schedule, not a fresh burst. Every call carries the
payload's idempotency key in the ``Idempotency-Key`` header; a receiver that honours
it opens one ticket however many times the call is repeated (docs/decisions/0109).

The ``Authorization`` header is read from a file at each call (a mounted Secret:
rotating it needs no restart); the payload schema is
``docs/schemas/rma-ticket.schema.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

MAX_ANSWER = 64 * 1024
"""Largest answer body read (the ticket id is all that is wanted from it)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """What one call came to."""

    ok: bool
    """A 2xx answer: the receiver has the ticket (or the close)."""
    status: int | None = None
    """The HTTP status; None when no answer came (refused connection, timeout)."""
    ticket_id: str | None = None
    """The receiver's id for the ticket: ``ticketId`` (or ``id``) of a JSON answer."""
    error: str = ""


class TicketWebhook:
    """POSTs ticket payloads to one URL, with a bounded timeout per call."""

    def __init__(
        self,
        url: str,
        *,
        auth_file: Path | None = None,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the ticket webhook must be an http(s) URL, got {url!r}")
        self.url = url
        self.auth_file = auth_file
        self.timeout_s = timeout_s
        self._transport = transport

    def _headers(self, key: str) -> dict[str, str]:
        headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
        if self.auth_file is not None:
            value = self.auth_file.read_text().strip()
            if value:
                headers["Authorization"] = value
        return headers

    async def send(self, payload: dict[str, Any]) -> Delivery:
        """One attempt; never raises for what the network or the receiver does."""
        try:
            headers = self._headers(str(payload["idempotencyKey"]))
        except OSError as exc:
            return Delivery(False, error=f"auth header file unreadable: {exc}")
        try:
            async with httpx.AsyncClient(
                timeout=self.timeout_s, transport=self._transport, follow_redirects=False
            ) as client:
                answer = await client.post(self.url, json=payload, headers=headers)
        except httpx.TimeoutException:
            return Delivery(False, error=f"no answer within {self.timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Delivery(False, error=f"{type(exc).__name__}: {exc}"[:300])
        if not 200 <= answer.status_code < 300:
            text = answer.text[:200].strip()
            return Delivery(
                False, answer.status_code, error=f"HTTP {answer.status_code} {text}".strip()
            )
        return Delivery(True, answer.status_code, ticket_id=_ticket_id(answer.content))


def _ticket_id(body: bytes) -> str | None:
    if not body or len(body) > MAX_ANSWER:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    value = data.get("ticketId", data.get("id"))
    if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
        return str(value)[:200]
    return None
