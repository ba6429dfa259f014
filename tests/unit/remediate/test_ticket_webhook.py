"""The ticket webhook client: one POST per attempt with the idempotency key and the
Authorization header from its file; every failure is an answer, never an exception."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from gpufleet.remediate.ticket_webhook import Delivery, TicketWebhook

PAYLOAD = {"idempotencyKey": "n0/xid-79/5#opened", "event": "opened"}


def _send(webhook: TicketWebhook) -> Delivery:
    return asyncio.run(webhook.send(dict(PAYLOAD)))


def test_a_2xx_delivers_and_names_the_receivers_ticket(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    auth = tmp_path / "authorization"
    auth.write_text("Bearer s3cret\n")

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={"ticketId": "RMA-17"})

    hook = TicketWebhook(
        "http://127.0.0.1:9/t", auth_file=auth, transport=httpx.MockTransport(answer)
    )
    d = _send(hook)
    assert (d.ok, d.status, d.ticket_id) == (True, 201, "RMA-17")
    (request,) = seen
    assert request.method == "POST"
    assert request.headers["Idempotency-Key"] == "n0/xid-79/5#opened"
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert request.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("response", "ticket"),
    [
        (httpx.Response(200), None),
        (httpx.Response(200, text="ok"), None),
        (httpx.Response(200, json={"id": 42}), "42"),
        (httpx.Response(200, json=["T-1"]), None),
        (httpx.Response(204), None),
    ],
)
def test_any_2xx_acknowledges_whatever_its_body(
    response: httpx.Response, ticket: str | None
) -> None:
    hook = TicketWebhook("http://127.0.0.1:9/t", transport=httpx.MockTransport(lambda r: response))
    d = _send(hook)
    assert d.ok and d.ticket_id == ticket


def test_a_5xx_a_4xx_a_timeout_and_a_refused_connection_are_failures() -> None:
    def fail(status: int) -> TicketWebhook:
        return TicketWebhook(
            "http://127.0.0.1:9/t",
            transport=httpx.MockTransport(lambda r: httpx.Response(status, text="down")),
        )

    for status in (500, 503, 400, 404, 301):
        d = _send(fail(status))
        assert not d.ok and d.status == status and str(status) in d.error

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    d = _send(TicketWebhook("http://127.0.0.1:9/t", transport=httpx.MockTransport(slow)))
    assert not d.ok and d.status is None and "no answer" in d.error

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    d = _send(TicketWebhook("http://127.0.0.1:9/t", transport=httpx.MockTransport(refused)))
    assert not d.ok and "ConnectError" in d.error


def test_an_unreadable_auth_file_sends_nothing(tmp_path: Path) -> None:
    calls: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200)

    hook = TicketWebhook(
        "http://127.0.0.1:9/t",
        auth_file=tmp_path / "missing",
        transport=httpx.MockTransport(answer),
    )
    d = _send(hook)
    assert not d.ok and "auth header file" in d.error and calls == []


def test_only_http_urls() -> None:
    with pytest.raises(ValueError, match="http"):
        TicketWebhook("file:///etc/passwd")
