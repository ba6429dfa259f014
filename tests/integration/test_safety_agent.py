"""The agent judges with the controller's FleetPolicy, and a fault it saw stays visible
until the controller has recorded it (issue 33, defects 8 and 10, agent side), live.

Real apiserver, ``gpufleet agent`` processes started with the command line the chart
gives them (``--policy-name``), on KWOK nodes of this module's own, the lifecycle
controller as a process. Broken on purpose:

- the agent's FleetPolicy is missing (fail closed), differs from the built-in policy,
  then is made invalid (the last valid one must be kept);
- a fault is raised and gone again while no controller runs, with a clear time (2 s)
  far shorter than the outage, and the agent that saw it is SIGKILLed and replaced:
  the controller started afterwards must still find it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from controller_harness import (
    GV,
    Api,
    create_kwok_nodes,
    free_port,
    install,
    policy_spec,
    put_policy,
    running,
)
from waiting import wait_for

from gpufleet.domain import conditions, well_known

pytestmark = pytest.mark.integration

POLICY = "safety-agent"
MISSING = "safety-agent-missing"
POOL = "safety-agent"
NODES = [f"safety-agent-{i}" for i in range(3)]
GPU = "GpuProblem"


def fleet_spec(*, valid: bool = True) -> dict[str, Any]:
    """The test FleetPolicy: XID 13 reboots (the built-in policy restarts the job),
    conditions clear after 2 s. Invalid: the ladder loses the reboot its rules name
    (the apiserver accepts it; the controller's and the agent's validation do not)."""
    spec = policy_spec()
    for rule in spec["rules"]:
        if rule["match"].get("xid") == 13:
            rule.update(action="reboot", repeat=None)
    spec["detection"]["raiseAfterSeconds"] = 0
    spec["detection"]["clearAfterSeconds"] = 2
    if not valid:
        spec["ladder"] = [e for e in spec["ladder"] if e["step"] != "reboot"]
    return spec


class AgentProcess:
    """``gpufleet agent`` on simulated hardware, as the chart starts it (plus the
    loopback fault-injection API and metrics)."""

    def __init__(self, info: Any, node: str, policy_name: str, logs: Path) -> None:
        self.node = node
        self.inject_port, self.metrics_port = free_port(), free_port()
        args = [
            *(sys.executable, "-m", "gpufleet.cli.main", "agent", "--node", node),
            *("--backend", "simulated", "--kubeconfig", str(info.kubeconfig)),
            *("--inject-port", str(self.inject_port), "--metrics-port", str(self.metrics_port)),
            *("--interval", "0.5", "--policy-name", policy_name),
        ]
        self.log = logs / f"agent-{node}-{self.metrics_port}.log"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.started = time.time()
        wait_for(f"the agent of {node}", self._up, timeout=60)

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited: {self.log.read_text()[-3000:]}")
        return self.metric("gpufleet_agent_policy_read") is not None

    def metric(self, name: str, **labels: str) -> float | None:
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        except httpx.HTTPError:
            return None
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return None

    def inject(self, fault: str) -> None:
        url = f"http://127.0.0.1:{self.inject_port}/inject"
        assert httpx.post(url, json={"fault": fault}, timeout=5).status_code == 200

    def recover(self) -> None:
        assert httpx.post(f"http://127.0.0.1:{self.inject_port}/recover", timeout=5).is_success

    def observed(self, fault: str) -> float:
        return self.metric("gpufleet_agent_faults_observed_total", fault=fault) or 0.0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture(scope="module")
def env(local_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    api = Api(local_cluster)
    install(api)
    put_policy(api, POLICY, fleet_spec())
    create_kwok_nodes(api, NODES, POOL)
    logs = tmp_path_factory.mktemp("safety-agent-logs")
    agents: list[AgentProcess] = []

    def start(node: str, policy_name: str = POLICY) -> AgentProcess:
        agent = AgentProcess(local_cluster, node, policy_name, logs)
        agents.append(agent)
        return agent

    try:
        yield local_cluster, api, start, logs
    finally:
        for agent in agents:
            agent.stop()
        for node in NODES:
            api.delete(f"/api/v1/nodes/{node}")
        api.delete(f"{GV}/fleetpolicies/{POLICY}")


def condition(api: Api, node: str, ctype: str = GPU) -> dict[str, Any]:
    for c in api.node(node).get("status", {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return {}


def status(api: Api, node: str) -> str | None:
    return condition(api, node).get("status")


def acknowledge(api: Api, node: str) -> None:
    """What the controller writes with the record it decided: the watermark covering
    the condition's latest occurrence (played here, no controller runs)."""
    c = condition(api, node)
    latest = max(f.at for f in conditions.faults_of(node, GPU, c["status"], c["message"]))
    value = json.dumps({GPU: latest})
    api.patch(
        f"/api/v1/nodes/{node}",
        {"metadata": {"annotations": {well_known.ANNOTATION_FAULTS_SEEN: value}}},
    )


def test_without_its_fleetpolicy_the_agent_fails_closed(env: Any) -> None:
    _info, api, start, _logs = env
    node = NODES[0]
    agent = start(node, MISSING)  # no FleetPolicy of that name
    assert agent.metric("gpufleet_agent_policy_read") == 0.0
    wait_for("the healthy conditions written", lambda: status(api, node) == "False")
    # XID 43: every policy here ignores it; failing closed, the agent raises it anyway.
    agent.inject("xid=43,gpu=1")
    wait_for("GpuProblem raised (fail closed)", lambda: status(api, node) == "True")
    assert '"xid":43' in condition(api, node)["message"]


def test_the_agent_raises_what_the_fleetpolicy_says_and_keeps_the_last_valid_one(
    env: Any,
) -> None:
    _info, api, start, _logs = env
    node = NODES[1]
    agent = start(node)
    wait_for("the FleetPolicy read", lambda: agent.metric("gpufleet_agent_policy_read") == 1.0)
    wait_for("the healthy conditions written", lambda: status(api, node) == "False")

    def judged(fault: str, key: str, times: float) -> None:
        """Inject, then wait until the agent observed it and published once more."""
        agent.inject(fault)
        wait_for(f"{key} observed", lambda: agent.observed(key) >= times)
        time.sleep(1.5)  # three more polls

    # The FleetPolicy ignores XID 43 (no condition: the agent is not failing closed) ...
    judged("xid=43,gpu=1", "xid-43", 1)
    assert status(api, node) == "False"
    # ... and reboots on XID 13, which the built-in policy only answers with a job restart.
    agent.inject("xid=13,gpu=0")
    wait_for("GpuProblem raised (the FleetPolicy's rule)", lambda: status(api, node) == "True")
    assert '"xid":13' in condition(api, node)["message"]
    agent.recover()
    acknowledge(api, node)
    wait_for("GpuProblem cleared once recorded", lambda: status(api, node) == "False")

    # The FleetPolicy turns invalid: the agent says so and keeps judging with the last
    # valid one (not the built-in policy, and not failing closed).
    path = f"{GV}/fleetpolicies/{POLICY}"
    api.patch(path, {"spec": {"ladder": fleet_spec(valid=False)["ladder"]}})
    wait_for("invalid seen", lambda: agent.metric("gpufleet_agent_policy_valid") == 0.0)
    assert agent.metric("gpufleet_agent_policy_read") == 1.0
    judged("xid=43,gpu=2", "xid-43", 2)
    assert status(api, node) == "False"
    agent.inject("xid=13,gpu=1")
    wait_for("GpuProblem raised (the last valid policy)", lambda: status(api, node) == "True")
    api.patch(path, {"spec": {"ladder": fleet_spec()["ladder"]}})
    wait_for("valid again", lambda: agent.metric("gpufleet_agent_policy_valid") == 1.0)


def test_a_fault_gone_before_any_controller_acted_survives_an_agent_restart_until_recorded(
    env: Any,
) -> None:
    info, api, start, logs = env
    node = NODES[2]
    first = start(node)
    wait_for("the FleetPolicy read", lambda: first.metric("gpufleet_agent_policy_read") == 1.0)
    wait_for("the healthy conditions written", lambda: status(api, node) == "False")
    # No controller runs. The fault comes and goes within one poll or two; the
    # FleetPolicy's clear time is 2 s.
    first.inject("xid=79,gpu=3")
    wait_for("GpuProblem raised", lambda: status(api, node) == "True")
    first.recover()
    raised = condition(api, node)
    deadline = time.monotonic() + 8  # four clear times, 16 polls
    while time.monotonic() < deadline:
        assert status(api, node) == "True", "the fault was dropped before it was recorded"
        time.sleep(0.5)

    # The agent that saw it dies; a new one (fresh simulated GPUs: nothing wrong now)
    # takes the unrecorded condition over instead of writing GpuProblem=False.
    first.stop(signal.SIGKILL)
    second = start(node)
    since = second.started
    wait_for(
        "the new agent's first writes",
        lambda: _heartbeat(condition(api, node, "NvlinkProblem")) >= since - 1,
    )
    time.sleep(2)  # four more polls
    now = condition(api, node)
    assert now["status"] == "True" and now["message"] == raised["message"]

    # A controller comes (it manages only this node): it records the fault, and the
    # agent clears the condition once the record covers it.
    selector = ("--node-selector", f"kubernetes.io/hostname={node}")
    with running(info, logs, policy=POLICY, extra_args=selector) as ctl:
        wait_for("GpuProblem cleared once recorded", lambda: status(api, node) == "False", 60)
        ctl.stop()
    record = api.record(node)
    assert record is not None and any(o.key == "xid-79" for o in record.occurrences)
    seen = conditions.faults_recorded(
        api.node(node)["metadata"]["annotations"].get(well_known.ANNOTATION_FAULTS_SEEN)
    )
    (fault,) = conditions.faults_of(node, GPU, "True", raised["message"])
    assert seen[GPU] >= fault.at


def _heartbeat(c: dict[str, Any]) -> float:
    from gpufleet.domain.enrollment import parse_rfc3339

    with contextlib.suppress(TypeError, ValueError):
        return parse_rfc3339(c.get("lastHeartbeatTime")) or 0.0
    return 0.0
