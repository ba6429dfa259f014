"""A MaintenancePlan whose change is a command the nodes' agents run (decision 0120).

Real apiserver and KWOK nodes, the real lifecycle controller process, a real agent per
node (simulated GPUs) with a commands directory of real programs. The plan drains each
node, its agent runs the named command (here a script that records the node and fails on
one of them), the controller verifies the node through the same agent and returns it;
the node whose command failed goes to triage and counts as the plan's failure. A second
plan names a command no node has: the first node fails and the plan stops itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    RunningAgent,
    create_kwok_nodes,
    install,
    maintenance_cli,
    plan_status,
    policy_spec,
    put_policy,
    reset_node,
    running,
    wait_for,
)

from gpufleet.health.agent import AgentSettings
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

POOL = "cmd-pool"
NODES = ["cmd-a", "cmd-b", "cmd-c"]
FAILS_ON = "cmd-b"
SELECT = "example.com/fw-batch"


@pytest.fixture(scope="module")
def env(
    local_cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ClusterInfo, Api, Path, Path]]:
    api = Api(local_cluster)
    install(api)
    create_kwok_nodes(api, NODES, pool=POOL)
    for node in NODES:
        api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {SELECT: "yes"}}})
    logs = tmp_path_factory.mktemp("maintenance-command")
    commands = tmp_path_factory.mktemp("maintenance.d")
    script = commands / "flash-fw"
    # What a firmware tool does here: records that it ran on this node; fails on one node.
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$NODE_NAME $GPUFLEET_REQUEST_ID" >> {logs}/flashed\n'
        f'if [ "$NODE_NAME" = {FAILS_ON} ]; then echo "flash verify failed" >&2; exit 4; fi\n'
        'echo "flashed 28.39.1002"\n'
    )
    script.chmod(0o755)
    spec = policy_spec()
    spec["safety"]["budget"] = {"maxNodes": 1, "maxPercent": 100, "minNodes": 1}
    put_policy(api, "maintenance-command", spec)
    try:
        yield local_cluster, api, logs, commands
    finally:
        for plan in ("fw", "missing"):
            api.delete(f"{GV}/maintenanceplans/{plan}")
        api.delete(f"{GV}/fleetpolicies/maintenance-command")
        for node in NODES:
            reset_node(api, node)
            api.delete(f"/api/v1/nodes/{node}")


def test_the_agents_run_the_named_command_and_a_failure_goes_to_triage(env: Any) -> None:
    info, api, logs, commands = env
    settings = AgentSettings(interval_s=0.2, request_retry_s=1.0, maintenance_commands=commands)
    agents = [RunningAgent(info, n, settings) for n in NODES]
    with (
        agents[0].started(),
        agents[1].started(),
        agents[2].started(),
        running(info, logs, policy="maintenance-command"),
    ):
        wait_for(
            "burn-in passed",
            lambda: all(api.state(n) == "production" for n in NODES),
            timeout=120,
        )
        maintenance_cli(
            info, "create", "fw", "--action", "command", "--command", "flash-fw",
            "--command-timeout", "60", "-l", f"{SELECT}=yes", "--max-failures", "2",
        )  # fmt: skip
        wait_for(
            "plan finished",
            lambda: plan_status(api, "fw").get("phase") in ("Completed", "Stopped"),
            timeout=240,
        )
        status = plan_status(api, "fw")
        phases = {n["name"]: n["phase"] for n in status["nodes"]}
        assert status["phase"] == "Completed", status
        assert phases == {"cmd-a": "Succeeded", "cmd-b": "Failed", "cmd-c": "Succeeded"}
        assert status["failed"] == 1 and status["succeeded"] == 2
        # Each node ran the command once, in its own drained turn (budget: one at a time).
        flashed = [line.split() for line in (logs / "flashed").read_text().splitlines()]
        assert sorted(node for node, _ in flashed) == NODES
        assert all(rid.startswith("command-") for _, rid in flashed)
        assert api.state("cmd-a") == "production" and api.state("cmd-c") == "production"
        assert api.state(FAILS_ON) == "triage"
        record = api.record(FAILS_ON)
        assert record is not None
        assert "flash-fw failed: flash-fw exited 4: flash verify failed" in record.reason
        for n in ("cmd-a", "cmd-c"):
            node = api.node(n)
            assert not node["spec"].get("unschedulable"), n
        shown = maintenance_cli(info, "show", "fw")
        assert "command flash-fw" in shown and "Failed" in shown


def test_a_command_no_node_has_fails_the_first_node_and_stops_the_plan(env: Any) -> None:
    info, api, logs, commands = env
    nodes = ["cmd-a", "cmd-c"]  # cmd-b is in triage from the test above
    settings = AgentSettings(interval_s=0.2, request_retry_s=1.0, maintenance_commands=commands)
    with (
        RunningAgent(info, nodes[0], settings).started(),
        RunningAgent(info, nodes[1], settings).started(),
        running(info, logs, policy="maintenance-command"),
    ):
        wait_for("in production", lambda: all(api.state(n) == "production" for n in nodes), 60)
        maintenance_cli(info, "create", "missing", "--action", "command", "--command", "bios-2.1",
            "-l", f"{SELECT}=yes")  # fmt: skip
        wait_for("stopped", lambda: plan_status(api, "missing").get("phase") == "Stopped", 120)
        status = plan_status(api, "missing")
        failed = [n for n in status["nodes"] if n["phase"] == "Failed"]
        assert len(failed) == 1
        assert sum(1 for n in status["nodes"] if n["phase"] == "Succeeded") == 0
        record = api.record(failed[0]["name"])
        assert record is not None and "no maintenance command 'bios-2.1'" in record.reason
        assert "flash-fw" in record.reason  # what the node does have
