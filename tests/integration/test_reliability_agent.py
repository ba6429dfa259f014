"""Reliability: the node agent carries out only requests the controller issued for its node
in its current state, and never a disruptive one on a node with work (decision 0074).

Real apiserver and KWOK nodes, the real lifecycle controller process, a real node agent
(in this process, on the simulated hardware backend, whose GPU-reset counter tells whether
a reset happened). docs/reliability.md lists these cases with their outcomes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    RunningAgent,
    create_kwok_nodes,
    install,
    policy_spec,
    put_policy,
    report_fault,
    reset_node,
    running,
    wait_for,
)

from gpufleet.domain import agent_requests, node_reports, well_known
from gpufleet.domain.faults import Subsystem
from gpufleet.domain.ladder import Step
from gpufleet.domain.records import Incident, NodeRecord, StepAttempt, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

NS = "agent-guard"
NODES = ["guard-forged", "guard-copied", "guard-empty", "guard-busy"]


@pytest.fixture(scope="module")
def env(
    local_cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ClusterInfo, Api, Path]]:
    api = Api(local_cluster)
    install(api)
    for node in NODES:  # one pool each: the disruption budget of one never holds another
        create_kwok_nodes(api, [node], pool=node)
    api.post(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        ok=(201, 409),
    )
    logs = tmp_path_factory.mktemp("reliability-agent")
    try:
        yield local_cluster, api, logs
    finally:
        api.delete(f"/api/v1/namespaces/{NS}")
        for policy in ("agent-guard", "agent-guard-busy"):
            api.delete(f"{GV}/fleetpolicies/{policy}")
        for node in NODES:
            api.delete(f"/api/v1/nodes/{node}")


def answer(api: Api, node: str) -> node_reports.Answer | None:
    """The agent's answer on its Node (annotation gpufleet.io/agent-result)."""
    return node_reports.answer_of(api.node(node))


def refused(api: Api, node: str) -> str:
    """The refusal on the Node as "<id>: <detail>" ("" while there is none)."""
    found = answer(api, node)
    return f"{found.id}: {found.detail}" if found and found.outcome == "refused" else ""


def refusal_events(api: Api, node: str) -> list[dict[str, Any]]:
    items = api.get(
        f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{node}"
    )["items"]
    return [e for e in items if e["reason"] == "RequestRefused"]


def set_annotations(api: Api, node: str, **values: str | None) -> None:
    keys = {"record": well_known.ANNOTATION_RECORD, "request": well_known.ANNOTATION_AGENT_REQUEST}
    ann = {keys[k]: v for k, v in values.items()}
    api.patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": ann}})


def start_pod(api: Api, node: str, name: str) -> None:
    """A training pod placed on the node directly (no scheduler, every taint tolerated):
    work that is on the node whatever its state says."""
    api.post(
        f"/api/v1/namespaces/{NS}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "train", "image": "example.com/train:1"}],
            },
        },
    )
    wait_for(
        f"pod {name} running",
        lambda: (
            api.get(f"/api/v1/namespaces/{NS}/pods/{name}").get("status", {}).get("phase")
            == "Running"
        ),
        timeout=30,
    )


def remediating(node: str, opened: float) -> NodeRecord:
    """A record as the controller writes it when a node's gpu-reset step starts."""
    inc = Incident(
        key="xid-48",
        description="xid48 gpu2",
        opened_at=opened,
        plan=Step.GPU_RESET,
        drained=True,
        current=Step.GPU_RESET,
        tried=(StepAttempt(Step.GPU_RESET, 1, opened + 2.5),),
    )
    return replace(NodeRecord.new(node, at=opened, state=NodeState.REMEDIATING), incident=inc)


def test_a_hand_written_gpu_reset_on_a_production_node_with_a_job_is_refused(env: Any) -> None:
    info, api, _ = env
    node = "guard-forged"
    prod = NodeRecord.new(node, at=time.time(), state=NodeState.PRODUCTION)
    set_annotations(api, node, record=record_to_json(prod))
    start_pod(api, node, "forged-job")
    with RunningAgent(info, node).started() as a:
        set_annotations(api, node, request='{"id":"ops-reset-1","kind":"gpu-reset","gpu_index":0}')
        msg = wait_for("refusal", lambda: refused(api, node))
        assert msg.startswith("ops-reset-1: refused: the request carries no binding")
        # Forged with a binding for this node's state: still no request in production.
        forged = {
            "id": "ops-reset-2",
            "kind": "gpu-reset",
            "node": node,
            "state": "production",
            "incident": None,
            "started": time.time(),
        }
        set_annotations(api, node, request=json.dumps(forged))
        wait_for(
            "second refusal",
            lambda: (
                "ops-reset-2: refused: no request is carried out on a node in production"
                in refused(api, node)
            ),
        )
        wait_for("RequestRefused Events", lambda: len(refusal_events(api, node)) >= 2)
        events = refusal_events(api, node)
        assert all(e["type"] == "Warning" for e in events)
        assert any("no binding" in e["message"] for e in events)
        assert a.hw.resets == 0
        assert a.requests() == 2
        assert api.get(f"/api/v1/namespaces/{NS}/pods/forged-job")["status"]["phase"] == "Running"
    print(f"refused: {msg}")


def test_a_request_copied_from_another_node_is_refused(env: Any) -> None:
    info, api, _ = env
    node = "guard-copied"
    mine = remediating(node, opened=time.time())
    set_annotations(api, node, record=record_to_json(mine))
    other = agent_requests.issue(remediating("guard-empty", opened=time.time() - 60), "gpu-reset")
    assert other is not None
    with RunningAgent(info, node).started() as a:
        set_annotations(api, node, request=other.encode())
        msg = wait_for("refusal", lambda: refused(api, node))
        assert "issued for node guard-empty, not for guard-copied" in msg
        wait_for("RequestRefused Event", lambda: refusal_events(api, node))
        assert a.hw.resets == 0
    print(f"refused: {msg}")


def test_a_controller_issued_gpu_reset_on_an_empty_node_is_carried_out(env: Any) -> None:
    info, api, logs = env
    node = "guard-empty"
    put_policy(api, "agent-guard", policy_spec())
    with RunningAgent(info, node).started() as a, running(info, logs, policy="agent-guard"):
        a.hw.inject("xid=48,gpu=2")  # the rule for XID 48 starts the ladder at gpu-reset
        wait_for("remediating", lambda: api.state(node) == "remediating", timeout=30)
        wait_for("GPU reset carried out", lambda: a.hw.resets == 1, timeout=30)
        wait_for("back in production", lambda: api.state(node) == "production", timeout=90)
        assert a.hw.resets == 1
        assert not refusal_events(api, node)
        assert a.requests() == 0
        assert a.requests("gpu-reset", "carried-out") == 1
        assert a.requests("checks", "carried-out") == 1  # the verification, bound the same way
    reset_node(api, node)


def test_a_gpu_reset_refused_for_a_pod_that_landed_drains_the_node_again_never_escalates(
    env: Any,
) -> None:
    """The gate wrote the request once the node was proven empty; a pod lands after it;
    the agent refuses (decision 0074). The refusal sends the node back to draining (the pod
    is evicted), never up the ladder; the reset is asked again and carried out once."""
    info, api, logs = env
    node = "guard-busy"
    put_policy(api, "agent-guard-busy", policy_spec())
    with running(info, logs, policy="agent-guard-busy"):
        rv = api.resource_version(node)
        report_fault(api, node, 48, Subsystem.GPU)  # as the agent would report it
        wait_for("remediating", lambda: api.state(node) == "remediating", timeout=30)
        value = wait_for(
            "the gate's request",
            lambda: (api.node(node)["metadata"].get("annotations") or {}).get(
                well_known.ANNOTATION_AGENT_REQUEST
            ),
            timeout=30,
        )
        assert json.loads(value)["node"] == node  # the controller bound it
        start_pod(api, node, "late-job")  # work lands on the node after the proof
        with RunningAgent(info, node).started() as a:
            wait_for("refusal", lambda: refused(api, node), timeout=15)
            msg = refused(api, node)
            assert f"the node has work: 1 pod(s) run on the node ({NS}/late-job)" in msg
            events = wait_for("RequestRefused Event", lambda: refusal_events(api, node))
            assert "late-job" in events[0]["message"]
            wait_for(
                "the pod evicted by the new drain",
                lambda: api.http.get(f"/api/v1/namespaces/{NS}/pods/late-job").status_code == 404,
                timeout=60,
            )
            wait_for("GPU reset once the node is empty", lambda: a.hw.resets == 1, timeout=60)
            wait_for("verifying", lambda: api.state(node) in ("verifying", "production"))
            assert a.hw.resets == 1
        # The simulated agent may pass the verification before a poll sees it: the last
        # record written in verifying, read from the Node's history, still holds the incident.
        verifying = [r for r in api.records_since(node, rv) if r.state is NodeState.VERIFYING]
        assert verifying, "the node never was in verifying"
        record = verifying[-1]
        assert record.incident is not None
        tried = [
            (t.step.value, t.outcome.value if t.outcome else None) for t in record.incident.tried
        ]
        assert tried == [("gpu-reset", "refused"), ("gpu-reset", "succeeded")]  # no reboot
        drained_again = [h for h in record.history if h.trigger.value == "work-found"]
        assert len(drained_again) == 1
    print(f"refused: {msg}")
    reset_node(api, node)
