"""The RMA hand-off's decisions: one ticket per node and incident, opened, retried with a
bounded backoff, closed on request or when the node leaves triage/rma, never twice."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain import events as ev
from gpufleet.domain import rma
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState

from .conftest import Fleet, make_fleet

S = NodeState
T = rma.TicketState


def _triaged(reason: str = "NCCL hangs") -> tuple[NodeRecord, Fleet]:
    """A node taken to triage through decide(): operator triage, drained."""
    f = make_fleet(4)
    f.send("n0", ev.OperatorTriage(reason), now=100.0)
    f.send("n0", ev.DrainCompleted(), now=110.0)
    assert f.state("n0") is S.TRIAGE
    return f.records["n0"], f


def test_one_key_per_node_and_incident_kept_from_triage_to_rma() -> None:
    record, f = _triaged()
    key = rma.ticket_key(record)
    assert key == "n0/operator/100"
    f.send("n0", ev.OperatorRMA("vendor case 4711"), now=200.0)
    in_rma = f.records["n0"]
    assert in_rma.state is S.RMA
    assert rma.ticket_key(in_rma) == key  # the same hand-off: the same ticket


def test_no_key_outside_the_hand_off() -> None:
    assert rma.ticket_key(NodeRecord.new("n0", at=0.0, state=S.PRODUCTION)) is None
    assert rma.ticket_key(NodeRecord.new("n0", at=0.0, state=S.VERIFYING)) is None


def test_a_hand_off_without_incident_is_keyed_by_its_first_entry() -> None:
    f = make_fleet(1)
    f.records["n0"] = NodeRecord.new("n0", at=0.0, state=S.BURN_IN)
    f.send("n0", ev.OperatorTriage("looks odd"), now=50.0)
    assert f.state("n0") is S.TRIAGE and f.records["n0"].incident is None
    key = rma.ticket_key(f.records["n0"])
    assert key == "n0/handoff/50"
    f.send("n0", ev.OperatorRMA("send back"), now=90.0)
    assert rma.ticket_key(f.records["n0"]) == key


def test_a_node_in_the_hand_off_gets_a_ticket_to_open_and_keeps_it() -> None:
    record, _ = _triaged()
    t = rma.advance(None, record, None)
    assert t == rma.Ticket(key="n0/operator/100", state=T.OPENING)
    assert rma.due(t, now=0.0)
    sent = rma.attempted(t, 1.0, base_s=5, max_s=300, state="triage")
    opened = rma.delivered(sent, 2.0, "T-1")
    assert opened.state is T.OPEN and opened.ticket_id == "T-1" and opened.attempts == 0
    assert rma.advance(opened, record, None) == opened  # nothing more to do
    assert not rma.due(opened, now=10_000.0)


def test_the_attempt_is_counted_and_the_next_scheduled_before_the_call() -> None:
    record, _ = _triaged()
    t = rma.advance(None, record, None)
    assert t is not None
    first = rma.attempted(t, 1000.0, base_s=5, max_s=300)
    assert (first.attempts, first.next_at, first.sent) == (1, 1005.0, True)
    failed = rma.failed(first, "HTTP 500 boom")
    assert failed.state is T.OPENING and failed.last_error == "HTTP 500 boom"
    assert not rma.due(failed, now=1004.0) and rma.due(failed, now=1005.0)
    second = rma.attempted(failed, 1005.0, base_s=5, max_s=300)
    assert (second.attempts, second.next_at) == (2, 1015.0)
    # A restart reads the record: same key, same count, same schedule.
    assert rma.decode_ticket(rma.encode_ticket(second)) == second


def test_backoff_doubles_and_is_bounded() -> None:
    delays = [rma.retry_delay(n, base_s=5, max_s=300) for n in range(1, 10)]
    assert delays == [5, 10, 20, 40, 80, 160, 300, 300, 300]
    assert rma.retry_delay(0, base_s=5, max_s=300) == 0
    assert rma.retry_delay(10_000, base_s=5, max_s=300) == 300


@given(st.integers(min_value=1, max_value=100_000), st.floats(0.1, 60), st.floats(60, 3600))
def test_backoff_never_exceeds_its_bound(attempt: int, base: float, cap: float) -> None:
    assert 0 < rma.retry_delay(attempt, base_s=base, max_s=cap) <= cap


def test_a_close_request_closes_the_open_ticket() -> None:
    record, _ = _triaged()
    opened = rma.Ticket(key="n0/operator/100", state=T.OPEN, ticket_id="T-1", sent=True)
    close = rma.CloseRequest(by="admin", reason="GPU board replaced", at=300.0)
    closing = rma.advance(opened, record, close)
    assert closing is not None
    assert closing.state is T.CLOSING and closing.close_by == "admin"
    assert closing.ticket_id == "T-1" and rma.due(closing, now=0.0)
    assert rma.event_of(closing) == "closed"
    done = rma.delivered(rma.attempted(closing, 301.0, base_s=5, max_s=300), 302.0, None)
    assert done.state is T.CLOSED and done.closed_at == 302.0 and done.ticket_id == "T-1"
    # Still in rma: the closed ticket stays, so nothing is opened again.
    assert rma.advance(done, record, None) == done
    assert rma.advance(done, record, close) == done


def test_a_ticket_never_sent_is_closed_without_a_call() -> None:
    record, _ = _triaged()
    pending = rma.Ticket(key="n0/operator/100", state=T.OPENING)
    close = rma.CloseRequest(by="admin", reason="replaced", at=1.0)
    closed = rma.advance(pending, record, close)
    assert closed is not None and closed.state is T.CLOSED
    assert "never sent" in closed.close_reason and not rma.due(closed, now=1e9)


def test_a_ticket_whose_answer_was_lost_is_closed_by_a_call() -> None:
    record, _ = _triaged()
    lost = rma.Ticket(key="n0/operator/100", state=T.OPENING, attempts=1, sent=True)
    close = rma.CloseRequest(by="admin", reason="replaced", at=1.0)
    closing = rma.advance(lost, record, close)
    assert closing is not None and closing.state is T.CLOSING and closing.attempts == 0


def test_a_node_that_leaves_the_hand_off_has_its_ticket_closed_then_forgotten() -> None:
    _, f = _triaged()
    opened = rma.Ticket(key="n0/operator/100", state=T.OPEN, sent=True, evidence="ns/cm")
    f.send("n0", ev.OperatorReturn("reseated"), now=400.0)
    back = f.records["n0"]
    assert back.state is S.VERIFYING
    closing = rma.advance(opened, back, None)
    assert closing is not None and closing.state is T.CLOSING
    assert "left" in closing.close_reason and closing.evidence == "ns/cm"
    done = rma.delivered(closing, 401.0, None)
    assert rma.advance(done, back, None) is None  # forgotten


def test_a_new_incident_closes_the_old_ticket_then_opens_a_new_one() -> None:
    record, _ = _triaged()
    old = rma.Ticket(key="n0/xid-79/1", state=T.OPEN, sent=True)
    closing = rma.advance(old, record, None)
    assert closing is not None and closing.state is T.CLOSING and closing.key == old.key
    done = rma.delivered(closing, 2.0, None)
    fresh = rma.advance(done, record, None)
    assert fresh == rma.Ticket(key="n0/operator/100", state=T.OPENING)


def test_no_ticket_without_a_hand_off() -> None:
    assert rma.advance(None, NodeRecord.new("n0", at=0.0, state=S.PRODUCTION), None) is None


def test_idempotency_keys_differ_per_event_and_not_per_attempt() -> None:
    assert rma.idempotency_key("n0/xid-79/5", "opened") == "n0/xid-79/5#opened"
    assert rma.idempotency_key("n0/xid-79/5", "closed") != rma.idempotency_key(
        "n0/xid-79/5", "opened"
    )


def test_records_round_trip_and_malformed_ones_decode_to_nothing() -> None:
    full = rma.Ticket(
        key="n0/xid-79/5",
        state=T.CLOSED,
        attempts=3,
        next_at=12.5,
        sent=True,
        ticket_id="T-9",
        evidence="gpufleet-evidence/cm",
        opened_at=10.0,
        closed_at=11.0,
        last_error="HTTP 502",
        close_reason="replaced",
        close_by="alice",
    )
    assert rma.decode_ticket(rma.encode_ticket(full)) == full
    bad_tickets = (
        None,
        "",
        "{",
        "[]",
        '{"key": "k"}',
        '{"key": "k", "state": "lost"}',
        '{"key": "", "state": "open"}',
        '{"key": "k", "state": "open", "attempts": -1}',
    )
    for bad in bad_tickets:
        assert rma.decode_ticket(bad) is None, bad
    req = rma.CloseRequest(by="alice", reason="replaced", at=5.0)
    assert rma.decode_close(rma.encode_close(req)) == req
    bad_requests = (
        None,
        "x",
        '{"by": "a"}',
        '{"by": 1, "reason": "r", "at": 1}',
        '{"by": "a", "reason": "r", "at": true}',
    )
    for bad in bad_requests:
        assert rma.decode_close(bad) is None, bad


def test_long_texts_are_cut_in_the_record() -> None:
    t = rma.failed(rma.Ticket(key="k", state=T.OPENING), "x" * 5000)
    assert len(t.last_error) == rma.MAX_TEXT
    assert replace(t, last_error="") != t


def test_a_move_from_triage_to_rma_is_told_once_on_the_same_ticket() -> None:
    record, f = _triaged()
    t = rma.advance(None, record, None)
    assert t is not None
    sent = rma.attempted(t, 1.0, base_s=5, max_s=300, state=record.state.value)
    assert sent.reported == "triage"
    opened = rma.delivered(sent, 2.0, "T-1")
    assert rma.advance(opened, record, None) == opened  # told already: nothing to do
    f.send("n0", ev.OperatorRMA("vendor case 4711"), now=200.0)
    in_rma = f.records["n0"]
    update = rma.advance(opened, in_rma, None)
    assert update is not None and update.state is T.UPDATING and update.key == opened.key
    assert rma.event_of(update) == "updated" and rma.due(update, now=0.0)
    counted = rma.attempted(update, 201.0, base_s=5, max_s=300, state=in_rma.state.value)
    assert counted.reported == "rma" and counted.attempts == 1
    assert rma.idempotency_key(counted.key, "updated", counted.reported) == (
        "n0/operator/100#updated-rma"
    )
    told = rma.delivered(counted, 202.0, None)
    assert told.state is T.OPEN and told.ticket_id == "T-1" and told.reported == "rma"
    assert rma.advance(told, in_rma, None) == told
    assert rma.decode_ticket(rma.encode_ticket(told)) == told


def test_a_close_request_replaces_a_pending_update() -> None:
    record, _ = _triaged()
    pending = rma.Ticket(
        key="n0/operator/100", state=T.UPDATING, attempts=2, sent=True, reported="triage"
    )
    closing = rma.advance(pending, record, rma.CloseRequest("admin", "replaced", 1.0))
    assert closing is not None and closing.state is T.CLOSING and closing.attempts == 0
