"""``gpufleet node NAME`` shows the node's RMA ticket as the controller recorded it."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from gpufleet.cli import nodes_cmd
from gpufleet.domain import rma, well_known
from gpufleet.domain.records import NodeRecord, record_to_json
from gpufleet.domain.states import NodeState

T0 = 1_795_000_000.0


def _body(**annotations: str) -> dict[str, Any]:
    record = NodeRecord.new("gpu-node-0042", at=T0, state=NodeState.TRIAGE, reason="triage: x")
    return {
        "metadata": {
            "name": "gpu-node-0042",
            "labels": {},
            "annotations": {well_known.ANNOTATION_RECORD: record_to_json(record), **annotations},
        },
        "spec": {},
        "status": {"conditions": []},
    }


def _render(data: dict[str, Any]) -> str:
    console = Console(width=200, record=True)
    for part in nodes_cmd._draw_detail(data, wide=False):
        console.print(part)
    return console.export_text()


def test_a_ticket_being_retried_shows_its_attempts_and_the_last_error() -> None:
    t = rma.Ticket(
        key="gpu-node-0042/xid-79/1795000000",
        state=rma.TicketState.OPENING,
        attempts=3,
        next_at=T0 + 20,
        sent=True,
        last_error="HTTP 503 ticketing is down",
    )
    data = nodes_cmd.node_detail_data(
        _body(**{well_known.ANNOTATION_RMA_TICKET: rma.encode_ticket(t)}), [], T0 + 10
    )
    assert data["ticket"]["state"] == "opening" and data["ticket"]["attempts"] == 3
    assert data["ticket"]["closeRequested"] is False
    text = _render(data)
    assert "RMA ticket: gpu-node-0042/xid-79/1795000000 opening" in text
    assert "3 attempts" in text and "HTTP 503 ticketing is down" in text


def test_an_open_ticket_shows_the_receivers_id_and_the_evidence() -> None:
    t = rma.Ticket(
        key="k/xid-79/1",
        state=rma.TicketState.OPEN,
        ticket_id="RMA-17",
        evidence="gpufleet-evidence/gpufleet-evidence-gpu-node-0042-082377ab48",
    )
    body = _body(
        **{
            well_known.ANNOTATION_RMA_TICKET: rma.encode_ticket(t),
            well_known.ANNOTATION_RMA_CLOSE: rma.encode_close(rma.CloseRequest("a", "b", T0)),
        }
    )
    data = nodes_cmd.node_detail_data(body, [], T0)
    assert data["ticket"]["ticketId"] == "RMA-17" and data["ticket"]["closeRequested"] is True
    text = _render(data)
    assert "(ticket RMA-17)" in text and "configmap gpufleet-evidence/" in text
    assert "attempts" not in text


def test_no_ticket_no_line() -> None:
    data = nodes_cmd.node_detail_data(_body(), [], T0)
    assert data["ticket"] is None
    assert "RMA ticket" not in _render(data)
