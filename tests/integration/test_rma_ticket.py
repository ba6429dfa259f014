"""The RMA hand-off on the real cluster: a node that reaches triage gets an evidence bundle
(a ConfigMap) and exactly one ticket through a webhook receiver that fails and recovers,
even when it loses an answer and the controller is killed between attempts; ``gpufleet
machines rearm`` closes it; a move from triage to rma updates it; a node that leaves the
hand-off has it closed and forgotten.

Real apiserver and controller process; the receiver is a plain HTTP server on 127.0.0.1
that deduplicates by the Idempotency-Key header, as a ticketing system must. The nodes
are KWOK nodes of their own pool (no Slurm, no BMC); the test plays the node agent.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    SYSTEM_NS,
    Api,
    ControllerProcess,
    create_kwok_nodes,
    install,
    policy_spec,
    put_policy,
    running,
    wait_for,
)

from gpufleet.domain import conditions, rma, well_known
from gpufleet.domain import rma_payload as payloads
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.kubeapi.events import event_body

pytestmark = pytest.mark.integration

NODES = ["rma-00", "rma-01"]
POOL = "rma"
POLICIES = ("rma-tickets", "rma-restart")
KMSG = "NVRM: Xid (PCI:0000:1b:00): 79, pid=0, name=python, GPU has fallen off the bus."
SLOW_S = 5.0
"""How late a "slow" answer comes: well after the restart test's --ticket-timeout of 1 s."""
KMSG_EVENT = "NVRM: Xid (PCI:0000:1b:00): 45, pid=4242, name=python, Ch 00000010"


class Receiver:
    """A ticketing system: one ticket per Idempotency-Key, answers scripted per request.

    ``script`` is consumed one entry per request: ``"500"`` fails without recording,
    ``"lost"`` records the ticket and then answers 500 (the answer lost), ``"slow"`` records
    it and answers 200 after ``SLOW_S`` (later than the controller waits); when it is empty
    every request is answered 200 with the ticket's id.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.script: list[str] = []
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.tickets: dict[str, str] = {}  # idempotency key of an opening -> ticket id
        self.closed: dict[str, str] = {}  # ticket key -> the ticket id the close named
        self.invalid: list[str] = []
        self.auth: set[str] = set()  # Authorization headers seen
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.auth.add(self.headers.get("Authorization", ""))
                code, answer = receiver.handle(self.headers.get("Idempotency-Key", ""), body)
                if answer.pop("slow", False):
                    time.sleep(SLOW_S)
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/tickets"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def handle(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests.append((key, body))
            try:
                payloads.TicketPayload.model_validate(body)
            except ValueError as exc:
                self.invalid.append(str(exc))
            mode = self.script.pop(0) if self.script else "ok"
            if mode == "500":
                return 500, {"error": "ticketing is down"}
            if body["event"] == "opened":
                ticket_id = self.tickets.setdefault(key, f"T-{len(self.tickets) + 1}")
            else:
                ticket_id = body.get("ticketId") or ""
                self.closed[body["ticketKey"]] = ticket_id
            if mode == "lost":
                return 500, {"error": "gateway timeout after the ticket was created"}
            return 200, {"ticketId": ticket_id, **({"slow": True} if mode == "slow" else {})}

    def calls(self, node: str, event: str) -> list[tuple[str, dict[str, Any]]]:
        with self.lock:
            return [
                (k, b)
                for k, b in self.requests
                if b["node"]["name"] == node and b["event"] == event
            ]

    def opened_tickets(self, node: str) -> set[str]:
        with self.lock:
            return {t for k, t in self.tickets.items() if k.startswith(f"{node}/")}


@pytest.fixture(scope="module")
def env(
    local_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Api, Path, Receiver]]:
    api = Api(local_cluster)
    install(api)
    create_kwok_nodes(api, NODES, pool=POOL)
    receiver = Receiver()
    receiver.thread.start()
    logs = tmp_path_factory.mktemp("rma-logs")
    try:
        yield local_cluster, api, logs, receiver
    finally:
        receiver.server.shutdown()
        for node in NODES:
            api.delete(f"/api/v1/nodes/{node}")
            api.delete(f"{GV}/machines/{node}")
        for policy in POLICIES:
            api.delete(f"{GV}/fleetpolicies/{policy}")
        api.http.delete(
            f"/api/v1/namespaces/{SYSTEM_NS}/configmaps",
            params={"labelSelector": f"{well_known.LABEL_EVIDENCE}=rma"},
        )


def _controller_args(receiver: Receiver, logs: Path, timeout: float = 5) -> tuple[str, ...]:
    auth = logs / "ticket-authorization"
    auth.write_text("Bearer rma-test-token\n")  # as a mounted Secret holds it
    return (
        "--ticket-webhook", receiver.url,
        "--ticket-auth-file", str(auth),
        "--ticket-retry", "0.3",
        "--ticket-retry-max", "1",
        "--ticket-timeout", str(timeout),
        "--evidence-namespace", SYSTEM_NS,
    )  # fmt: skip


def _policy(api: Api, name: str) -> None:
    """XID 79 hands the node to triage (no BMC on these nodes)."""
    spec = policy_spec()
    for rule in spec["rules"]:
        if rule["match"].get("xid") == 79:
            rule["action"] = "triage"
    put_policy(api, name, spec)


def _fault(api: Api, node: str) -> None:
    fault = FaultEvent(
        FaultKind.XID,
        node,
        at=time.time(),
        xid=79,
        evidence=Evidence(gpu_index=3, pci_bus_id="0000:1b:00.0", message=KMSG),
    )
    api.set_condition(node, conditions.problem(Subsystem.PCIE, [fault]))


def _agent_event(api: Api, node: str, message: str) -> None:
    """A Warning Event about the Node, as the agent posts one for a fault it saw."""
    uid = api.node(node)["metadata"]["uid"]
    now = time.time()
    body = event_body(
        involved={"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
        type_="Warning",
        reason="Xid45",
        message=message,
        component=well_known.AGENT,
        instance=node,
        namespace="default",
        first=rfc3339(now),
        name=f"{node}.{int(now * 1e6):x}",
        host=node,
    )
    api.post("/api/v1/namespaces/default/events", body)


def _ticket(api: Api, node: str) -> rma.Ticket | None:
    ann = api.node(node)["metadata"].get("annotations") or {}
    return rma.decode_ticket(ann.get(well_known.ANNOTATION_RMA_TICKET))


def _ticket_in(api: Api, node: str, state: rma.TicketState) -> rma.Ticket | None:
    t = _ticket(api, node)
    return t if t is not None and t.state is state else None


def _machine(api: Api, node: str, serial: str) -> None:
    api.post(
        f"{GV}/machines",
        {
            "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
            "kind": "Machine",
            "metadata": {"name": node},
            "spec": {
                "macs": [f"02:00:00:00:0a:0{NODES.index(node)}"],
                "serial": serial,
                "bmc": {
                    "endpoint": "https://127.0.0.1:1",
                    "credentialsSecret": f"{SYSTEM_NS}/bmc-{node}",
                },
                "pool": POOL,
                "hardware": {"gpuModel": "NVIDIA-H100-80GB-HBM3", "gpuCount": 8, "hcaCount": 8},
            },
        },
        ok=(201, 409),
    )
    api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {well_known.LABEL_MACHINE: node}}})


def gpufleet(info: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", *args, "--kubeconfig", str(info.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _reasons(api: Api, node: str) -> list[str]:
    return [e["reason"] for e in api.events(node)]


def test_one_ticket_through_a_failing_receiver_and_rearm_closes_it(env: Any) -> None:
    info, api, logs, receiver = env
    node = NODES[0]
    _policy(api, POLICIES[0])
    _machine(api, node, serial="SN-RMA-00")
    receiver.script = ["500", "500", "500"]
    args = _controller_args(receiver, logs)
    with running(info, logs, policy=POLICIES[0], extra_args=args) as ctl:
        wait_for("node adopted", lambda: api.state(node) == "production")
        _agent_event(api, node, f"GPU 3: {KMSG_EVENT}")
        _fault(api, node)
        wait_for("triage", lambda: api.state(node) == "triage", timeout=30)
        ticket = wait_for(
            "ticket open",
            lambda: _ticket_in(api, node, rma.TicketState.OPEN),
            timeout=30,
        )
        opens = receiver.calls(node, "opened")
        assert len(opens) == 4  # three 500s, then the one that opened it
        assert {k for k, _ in opens} == {f"{ticket.key}#opened"}
        assert [b["attempt"] for _, b in opens] == [1, 2, 3, 4]
        assert receiver.opened_tickets(node) == {ticket.ticket_id}
        assert receiver.invalid == []
        assert receiver.auth == {"Bearer rma-test-token"}
        assert ticket.key.startswith(f"{node}/xid-79/")

        # The evidence: stored, referenced, and what a vendor asks for.
        body = opens[-1][1]
        ref = body["evidence"]
        assert ref["namespace"] == SYSTEM_NS and f"{SYSTEM_NS}/{ref['name']}" == ticket.evidence
        cm = api.get(f"/api/v1/namespaces/{SYSTEM_NS}/configmaps/{ref['name']}")
        assert cm["metadata"]["labels"][well_known.LABEL_EVIDENCE_NODE] == node
        bundle = json.loads(cm["data"]["bundle.json"])
        assert bundle == body["bundle"]  # every attempt carried the stored bundle
        assert any(KMSG in line for line in bundle["kernelLog"])  # from the condition
        assert any(KMSG_EVENT in line for line in bundle["kernelLog"])  # from the agent's Event
        assert bundle["incident"]["key"] == "xid-79"
        assert [f["scope"] for f in bundle["faults"]] == ["gpu3"]
        assert bundle["machine"]["serial"] == "SN-RMA-00"
        assert bundle["machine"]["bmcEndpoint"] == "https://127.0.0.1:1"
        assert bundle["lemon"]["node"] > 0
        assert any(c["source"] == "condition" and c["status"] == "True" for c in bundle["checks"])
        wait_for("TicketOpened Event", lambda: "TicketOpened" in _reasons(api, node))
        assert "TicketNotDelivered" in _reasons(api, node)
        failed = 'gpufleet_rma_ticket_calls_total{event="opened",result="failed"}'
        assert ctl.metric(failed) == 3.0
        assert ctl.metric('gpufleet_rma_ticket_calls_total{event="opened",result="ok"}') == 1.0

        # Triage -> rma is the same hand-off: the ticket is updated, not opened again.
        out = gpufleet(info, "node", "rma", node, "--reason", "vendor case 4711")
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for("rma", lambda: api.state(node) == "rma")
        wait_for("update sent", lambda: receiver.calls(node, "updated"), timeout=15)
        told = wait_for(
            "ticket open again", lambda: _ticket_in(api, node, rma.TicketState.OPEN), timeout=15
        )
        assert told.reported == "rma" and told.ticket_id == ticket.ticket_id
        ctl.wait_ticks(3)
        (update_key, update_body), *more = receiver.calls(node, "updated")
        assert more == [] and update_key == f"{ticket.key}#updated-rma"
        assert update_body["node"]["state"] == "rma"
        assert update_body["ticketId"] == ticket.ticket_id
        assert len(receiver.calls(node, "opened")) == 4
        assert receiver.opened_tickets(node) == {ticket.ticket_id}
        wait_for("TicketUpdated Event", lambda: "TicketUpdated" in _reasons(api, node))

        # The hardware was replaced: re-arming the Machine closes the ticket.
        out = gpufleet(info, "machines", "rearm", node, "--reason", "GPU board replaced")
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"RMA ticket {ticket.key} of node {node}: close requested" in out.stdout
        closed = wait_for(
            "ticket closed",
            lambda: _ticket_in(api, node, rma.TicketState.CLOSED),
            timeout=30,
        )
        assert receiver.closed == {ticket.key: ticket.ticket_id}
        (close_key, close_body), *more = receiver.calls(node, "closed")
        assert more == [] and close_key == f"{ticket.key}#closed"
        assert close_body["close"]["reason"] == "GPU board replaced"
        assert close_body["close"]["by"] == "admin"
        assert closed.ticket_id == ticket.ticket_id
        annotations = api.node(node)["metadata"].get("annotations") or {}
        assert well_known.ANNOTATION_RMA_CLOSE not in annotations
        wait_for("TicketClosed Event", lambda: "TicketClosed" in _reasons(api, node))

        # The node starts over on its new hardware: the record and the evidence go.
        out = gpufleet(
            info, "node", "return", node, "--hardware-replaced", "--reason", "board replaced"
        )
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for("provisioning", lambda: api.state(node) == "provisioning")
        wait_for("ticket record removed", lambda: _ticket(api, node) is None, timeout=15)
        path = f"/api/v1/namespaces/{SYSTEM_NS}/configmaps/{ref['name']}"
        wait_for("evidence deleted", lambda: api.http.get(path).status_code == 404, timeout=15)
        assert len(receiver.calls(node, "opened")) == 4 and len(receiver.calls(node, "closed")) == 1


def test_a_lost_answer_and_a_restart_still_open_exactly_one_ticket(env: Any) -> None:
    info, api, logs, receiver = env
    node = NODES[1]
    _policy(api, POLICIES[1])
    # The receiver creates the ticket but its answer is lost, then it creates it again (the
    # same key: the same ticket) and answers too late; then it is down.
    receiver.script = ["lost", "slow"] + ["500"] * 1000
    first = ControllerProcess(
        info, logs, policy=POLICIES[1], extra_args=_controller_args(receiver, logs, timeout=1)
    ).start()
    try:
        wait_for("node adopted", lambda: api.state(node) == "production")
        _fault(api, node)
        wait_for("triage", lambda: api.state(node) == "triage", timeout=30)
        wait_for("three attempts", lambda: len(receiver.calls(node, "opened")) >= 3, timeout=30)
    finally:
        first.kill()  # SIGKILL between attempts: nothing cleaned up
    before = _ticket(api, node)
    assert before is not None and before.state is rma.TicketState.OPENING
    assert before.sent and before.attempts >= 3 and before.last_error
    wait_for(
        "the timeout reported",
        lambda: any(
            e["reason"] == "TicketNotDelivered" and "no answer within 1 s" in e["message"]
            for e in api.events(node)
        ),
    )
    created = receiver.opened_tickets(node)
    assert len(created) == 1  # by the lost attempt
    (ticket_id,) = created
    with receiver.lock:
        receiver.script.clear()  # the receiver recovers

    args = _controller_args(receiver, logs)
    with running(info, logs, policy=POLICIES[1], extra_args=args) as ctl:
        after = wait_for(
            "ticket open after the restart",
            lambda: _ticket_in(api, node, rma.TicketState.OPEN),
            timeout=30,
        )
        assert after.key == before.key and after.ticket_id == ticket_id
        opens = receiver.calls(node, "opened")
        assert {k for k, _ in opens} == {f"{before.key}#opened"}
        assert opens[-1][1]["attempt"] > before.attempts  # the count went on after the restart
        ctl.wait_ticks(3)
        assert len(receiver.calls(node, "opened")) == len(opens)
        assert receiver.opened_tickets(node) == {ticket_id}

        # A node returned from triage leaves the hand-off: its ticket is closed, then forgotten.
        api.set_condition(node, conditions.healthy(Subsystem.PCIE))
        out = gpufleet(info, "node", "return", node, "--reason", "reseated the GPU")
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for("close sent", lambda: receiver.closed.get(before.key) == ticket_id, timeout=30)
        wait_for("ticket record removed", lambda: _ticket(api, node) is None, timeout=15)
        (_, close_body), *more = receiver.calls(node, "closed")
        assert more == [] and "left" in close_body["close"]["reason"]
    assert receiver.invalid == []
