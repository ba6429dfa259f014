"""Operator verbs on the real cluster: ``gpufleet node VERB`` and ``gpufleet breaker reset``.

The CLI writes a request; the lifecycle controller (a real process) decides it,
records who and why, answers with an Event and removes the request. Each test
runs the CLI as a person would and checks the Node, the Events and the
FleetPolicy status. The nodes are KWOK nodes of their own pool (no Slurm, no BMC).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    answer_request,
    create_kwok_nodes,
    install,
    policy_spec,
    put_policy,
    report_fault,
    running,
    wait_for,
)

from gpufleet.domain import well_known

pytestmark = pytest.mark.integration

NODES = [f"op-{i:02d}" for i in range(4)]
USER = "admin"  # the local cluster's token user, as the apiserver reports it


@pytest.fixture(scope="module")
def env(
    local_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Api, Path]]:
    api = Api(local_cluster)
    install(api)
    create_kwok_nodes(api, NODES, pool="operator")
    logs = tmp_path_factory.mktemp("operator-logs")
    try:
        yield local_cluster, api, logs
    finally:
        for node in NODES:
            api.delete(f"/api/v1/nodes/{node}")
        for name in ("op-verbs", "op-illegal", "op-breaker"):
            api.delete(f"{GV}/fleetpolicies/{name}")


def gpufleet(info: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", *args, "--kubeconfig", str(info.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def node_events(api: Api, node: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.events(node) if e["reason"] == reason]


def request_on(api: Api, node: str) -> str | None:
    ann = api.node(node)["metadata"].get("annotations") or {}
    value = ann.get(well_known.ANNOTATION_OPERATOR_REQUEST)
    return str(value) if value is not None else None


def test_triage_then_return_with_the_user_and_reason_on_record(env: Any) -> None:
    info, api, logs = env
    node = NODES[0]
    put_policy(api, "op-verbs", policy_spec())
    with running(info, logs, policy="op-verbs"):
        wait_for("node adopted", lambda: api.state(node) == "production")
        out = gpufleet(info, "node", "triage", node, "--reason", "NCCL hangs only here")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "accepted" in out.stdout and "production -> draining" in out.stdout
        wait_for("triage", lambda: api.state(node) == "triage")
        n = api.node(node)
        assert n["spec"].get("unschedulable") is True
        assert request_on(api, node) is None
        rec = api.record(node)
        assert rec is not None
        assert [t.target.value for t in rec.history][-2:] == ["draining", "triage"]
        assert f"by {USER}: NCCL hangs only here" in rec.history[-2].reason

        out = gpufleet(info, "node", "return", node, "--reason", "GPU 6 reseated")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "triage -> verifying" in out.stdout
        wait_for("verifying", lambda: api.state(node) == "verifying")
        # The FleetPolicy status follows the budget (a node entered verification; the
        # breaker did not change).
        wait_for(
            "status budget shows the node out",
            lambda: (
                (api.get(f"{GV}/fleetpolicies/op-verbs").get("status") or {})
                .get("budget", {})
                .get("operator", {})
                .get("outOfService")
                == 1
            ),
            timeout=10,
        )
        assert answer_request(api, node, passed=True) == "checks"
        wait_for("production", lambda: api.state(node) == "production")
        n = api.node(node)
        assert not n["spec"].get("unschedulable")
        assert not any(t["key"].startswith("gpufleet.io/") for t in n["spec"].get("taints") or [])
        answered = wait_for(
            "two OperatorRequest Events",
            lambda: (lambda e: e if len(e) >= 2 else None)(
                node_events(api, node, "OperatorRequest")
            ),
        )
        messages = [e["message"] for e in answered]
        assert any(
            f"return by {USER}: accepted: triage -> verifying: GPU 6 reseated" in m
            for m in messages
        )
        assert all(e["type"] == "Normal" for e in answered)
        wait_for(
            "status budget back to 0",
            lambda: (
                (api.get(f"{GV}/fleetpolicies/op-verbs").get("status") or {})
                .get("budget", {})
                .get("operator", {})
                .get("outOfService")
                == 0
            ),
            timeout=10,
        )


def test_an_illegal_verb_is_refused_with_an_event_and_a_nonzero_exit(env: Any) -> None:
    info, api, logs = env
    node = NODES[1]
    put_policy(api, "op-illegal", policy_spec())
    with running(info, logs, policy="op-illegal"):
        wait_for("node adopted", lambda: api.state(node) == "production")
        rv_state = api.record(node)
        out = gpufleet(info, "node", "rma", node, "--reason", "dead HBM")
        assert out.returncode == 1, out.stdout + out.stderr
        assert "refused" in out.stdout and "rma needs a node in triage or maintenance" in out.stdout
        assert api.state(node) == "production" and request_on(api, node) is None
        assert not api.node(node)["spec"].get("unschedulable")
        (event,) = node_events(api, node, "OperatorRequest")
        assert event["type"] == "Warning" and f"rma by {USER}: refused" in event["message"]
        after = api.record(node)
        assert after is not None and rv_state is not None
        assert after.history == rv_state.history
        # Paused: a legal verb is refused too (operator verbs obey the pause switch).
        spec = policy_spec(paused=True)
        api.patch(f"{GV}/fleetpolicies/op-illegal", {"spec": spec})
        wait_for(
            "paused policy in use",
            lambda: (
                (api.get(f"{GV}/fleetpolicies/op-illegal").get("status") or {}).get(
                    "observedGeneration"
                )
                == api.get(f"{GV}/fleetpolicies/op-illegal")["metadata"]["generation"]
            ),
        )
        out = gpufleet(info, "node", "maintenance", node, "--reason", "firmware")
        assert out.returncode == 1 and "the policy is paused" in out.stdout, out.stdout
        assert api.state(node) == "production"


def test_breaker_reset_closes_it_saves_status_and_posts_an_event(env: Any) -> None:
    info, api, logs = env
    first, second = NODES[2], NODES[3]
    spec = policy_spec()
    spec["safety"]["breaker"] = {"maxNodes": 1, "minNodes": 1, "maxPercent": 100}
    put_policy(api, "op-breaker", spec)
    path = f"{GV}/fleetpolicies/op-breaker"
    with running(info, logs, policy="op-breaker"):
        wait_for("nodes adopted", lambda: api.state(second) == "production")
        report_fault(api, first, 79)
        wait_for("first node isolated", lambda: api.state(first) not in (None, "production"))
        report_fault(api, second, 79)
        wait_for(
            "breaker open",
            lambda: ((api.get(path).get("status") or {}).get("breaker") or {}).get("open"),
            timeout=15,
        )
        assert api.state(second) == "production"
        held = api.record(second)
        assert held is not None and held.pending is not None
        # The held fault is dropped on request, and says so.
        out = gpufleet(info, "node", "dismiss", second, "--reason", "test injection")
        assert out.returncode == 0, out.stdout + out.stderr
        assert "dismissed" in out.stdout and "xid-79" in out.stdout
        rec = api.record(second)
        assert rec is not None and rec.pending is None and rec.pending_step is None

        out = gpufleet(
            info, "breaker", "reset", "--policy", "op-breaker", "--reason", "it was a test"
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "accepted" in out.stdout and "now closed" in out.stdout
        status = api.get(path)["status"]
        assert status["breaker"]["open"] is False and status["breaker"]["recent"] == []
        closed = [c for c in status["conditions"] if c["type"] == "BreakerOpen"]
        assert closed and closed[0]["status"] == "False"
        ann = api.get(path)["metadata"].get("annotations") or {}
        assert well_known.ANNOTATION_BREAKER_RESET not in ann
        items = api.get(
            "/api/v1/namespaces/default/events?fieldSelector="
            "involvedObject.kind%3DFleetPolicy,involvedObject.name%3Dop-breaker"
        )["items"]
        resets = [e for e in items if e["reason"] == "BreakerReset"]
        assert len(resets) == 1 and f"reset by {USER}: accepted" in resets[0]["message"]
        assert "it was a test" in resets[0]["message"]
        # Nothing retried the dismissed fault after the reset.
        wait_for("a few ticks", lambda: True)
        assert api.state(second) == "production"
        # A malformed request is refused, not applied, and removed.
        api.patch(path, {"metadata": {"annotations": {well_known.ANNOTATION_BREAKER_RESET: "{}"}}})
        wait_for(
            "malformed reset removed",
            lambda: (
                well_known.ANNOTATION_BREAKER_RESET
                not in (api.get(path)["metadata"].get("annotations") or {})
            ),
        )
    assert json.dumps(api.get(path)["status"]["breaker"]).count('"open": false') == 1
