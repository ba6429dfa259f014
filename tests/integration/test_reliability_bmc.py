"""Reliability: one BMC power action per decision, on the right machine only.

Real apiserver and KWOK nodes, the controller as a process, the Redfish emulator with its
misbehaviour switches (``/gpufleet/control``): BMCs that reset and answer 500, answer too
late, refuse with 503; controllers killed in the middle of a step; a Node whose
``bmc-secret`` names another node's BMC. The tests play the node agent (fault conditions,
check results). Counts are the emulator's: ``ResetPosts`` (Reset POSTs received) and
``ResetCount`` (resets performed). docs/reliability.md lists these cases and outcomes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    SYSTEM_NS,
    WELL_BEHAVED_BMC,
    Api,
    ControllerProcess,
    add_bmc_secret,
    answer_request,
    bmc_control,
    bmc_counters,
    policy_spec,
    put_policy,
    report_fault,
    reset_node,
    running,
    wait_for,
)
from fleet import Fleet

from gpufleet.domain import well_known
from gpufleet.domain.records import NodeRecord
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(fleet: Fleet) -> tuple[ClusterInfo, Api, Path]:
    """The shared fleet; its teardown puts every BMC and BMC Secret back (conftest.py)."""
    return fleet.info, fleet.api, fleet.logs


@pytest.fixture
def node(env: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A node of the shared cluster with a well-behaved BMC, left as it was found."""
    info, api, _ = env
    name: str = info.node_names[request.param]
    bmc_control(info, name, **WELL_BEHAVED_BMC)
    reset_node(api, name)
    try:
        yield name
    finally:
        bmc_control(info, name, **WELL_BEHAVED_BMC)
        reset_node(api, name)


def bmc_policy(api: Api, name: str, action: str = "reboot") -> None:
    """XID 79 -> ``action``; Kubernetes-only drains (no syncer in these tests)."""
    spec = policy_spec()
    spec["drain"]["slurm"] = "never"
    spec["rules"] = [
        {**r, "action": action} if r["match"].get("xid") == 79 else r for r in spec["rules"]
    ]
    put_policy(api, name, spec)


def posts(info: ClusterInfo, node: str) -> int:
    return int(bmc_counters(info, node)["ResetPosts"])


def resets(info: ClusterInfo, node: str) -> int:
    return int(bmc_counters(info, node)["ResetCount"])


def tried(api: Api, node: str) -> list[Any]:
    rec: NodeRecord | None = api.record(node)
    return list(rec.incident.tried) if rec is not None and rec.incident is not None else []


def verify_and_return(api: Api, node: str) -> None:
    wait_for("verifying", lambda: api.state(node) == "verifying", timeout=60)
    assert answer_request(api, node, passed=True) == "checks"
    wait_for("production", lambda: api.state(node) == "production")


@pytest.mark.parametrize("node", [0], indirect=True)
def test_a_bmc_that_resets_and_answers_500_gets_one_post(env: Any, node: str) -> None:
    info, api, logs = env
    bmc_policy(api, "bmc-500")
    bmc_control(info, node, failAfterReset=1)
    p0, r0 = posts(info, node), resets(info, node)
    with running(info, logs, policy="bmc-500"):
        report_fault(api, node, 79)
        wait_for("verifying", lambda: api.state(node) == "verifying", timeout=60)
        (step,) = tried(api, node)
        assert step.outcome.value == "succeeded"
        assert "HTTP 500" in step.detail and "shows the reset happened" in step.detail
        assert posts(info, node) == p0 + 1 and resets(info, node) == r0 + 1
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production")
    assert posts(info, node) == p0 + 1


@pytest.mark.parametrize("node", [1], indirect=True)
def test_a_bmc_that_answers_after_15s_gets_one_post(env: Any, node: str) -> None:
    info, api, logs = env
    bmc_policy(api, "bmc-slow")
    bmc_control(info, node, slowAnswers=1, slowAnswerSeconds=15.0)  # client timeout: 10 s
    p0 = posts(info, node)
    with running(info, logs, policy="bmc-slow"):
        report_fault(api, node, 79)
        wait_for("verifying", lambda: api.state(node) == "verifying", timeout=60)
        (step,) = tried(api, node)
        assert step.outcome.value == "succeeded" and "Timeout" in step.detail
        assert posts(info, node) == p0 + 1
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production")
    time.sleep(6)  # the slow answer has long been given up: still one POST
    assert posts(info, node) == p0 + 1


@pytest.mark.parametrize("node", [2], indirect=True)
def test_a_bmc_that_refuses_with_503_fails_the_step_and_the_ladder_goes_on(
    env: Any, node: str
) -> None:
    info, api, logs = env
    bmc_policy(api, "bmc-503")
    bmc_control(info, node, refuse=1)  # the first Reset POST only
    before = bmc_counters(info, node)
    with running(info, logs, policy="bmc-503"):
        report_fault(api, node, 79)
        wait_for("verifying", lambda: api.state(node) == "verifying", timeout=90)
        first, second = tried(api, node)
        assert (first.step.value, first.outcome.value) == ("reboot", "failed")
        assert "HTTP 503" in first.detail and "not performed" in first.detail
        # The policy's next rung (reboot has one attempt): a new decision, its own POST.
        assert (second.step.value, second.outcome.value) == ("power-cycle", "succeeded")
        after = bmc_counters(info, node)
        by_type = {
            t: n - before["ResetPostsByType"].get(t, 0)
            for t, n in after["ResetPostsByType"].items()
            if n - before["ResetPostsByType"].get(t, 0)
        }
        assert by_type == {"GracefulRestart": 1, "PowerCycle": 1}  # no ForceRestart, no retry
        assert after["ResetCount"] == before["ResetCount"] + 1
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production")


@pytest.mark.parametrize("node", [3], indirect=True)
def test_killed_one_second_after_the_reset_post_the_restart_posts_nothing(
    env: Any, node: str
) -> None:
    info, api, logs = env
    bmc_policy(api, "bmc-kill-after", action="power-cycle")
    bmc_control(info, node, bootSeconds=8.0)  # power stays off 8 s after the cycle
    p0 = posts(info, node)
    first = ControllerProcess(info, logs, policy="bmc-kill-after").start()
    try:
        report_fault(api, node, 79)
        wait_for("the Reset POST", lambda: posts(info, node) == p0 + 1, timeout=60)
        time.sleep(1)
        assert bmc_counters(info, node)["LastResetType"] == "PowerCycle"
    finally:
        first.kill()
    ann = api.node(node)["metadata"]["annotations"]
    assert well_known.ANNOTATION_BMC_ACTION in ann  # the write-ahead mark
    assert api.state(node) == "remediating"
    time.sleep(3)
    with running(info, logs, policy="bmc-kill-after"):
        wait_for("verifying", lambda: api.state(node) == "verifying", timeout=60)
        (step,) = tried(api, node)
        assert (step.step.value, step.outcome.value) == ("power-cycle", "succeeded")
        assert "controller restart" in step.detail
        assert posts(info, node) == p0 + 1
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production")
    assert posts(info, node) == p0 + 1
    rec = api.record(node)
    assert rec is not None  # one rung, no escalation:
    assert [t.target.value for t in rec.history][-4:] == [
        "draining",
        "remediating",
        "verifying",
        "production",
    ]


@pytest.mark.parametrize("node", [0], indirect=True)
def test_killed_after_the_step_is_recorded_but_before_the_post_one_post_follows(
    env: Any, node: str
) -> None:
    info, api, logs = env
    bmc_policy(api, "bmc-kill-before", action="power-cycle")
    bmc_control(info, node, getDelaySeconds=4.0)  # the controller is slow to reach the POST
    p0 = posts(info, node)
    first = ControllerProcess(info, logs, policy="bmc-kill-before").start()
    try:
        report_fault(api, node, 79)

        def started() -> bool:
            rec = api.record(node)
            return bool(rec and rec.incident and rec.incident.current is not None)

        wait_for("the step recorded as started", started, timeout=60)
    finally:
        first.kill()
    assert posts(info, node) == p0
    assert well_known.ANNOTATION_BMC_ACTION not in api.node(node)["metadata"]["annotations"]
    bmc_control(info, node, getDelaySeconds=0.0)
    with running(info, logs, policy="bmc-kill-before"):
        wait_for("verifying", lambda: api.state(node) == "verifying", timeout=60)
        (step,) = tried(api, node)
        assert (step.step.value, step.outcome.value) == ("power-cycle", "succeeded")
        assert posts(info, node) == p0 + 1
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production")
    assert posts(info, node) == p0 + 1


@pytest.mark.parametrize("node", [1], indirect=True)
def test_a_secret_naming_another_nodes_bmc_powers_nothing(env: Any, node: str) -> None:
    info, api, logs = env
    other = next(n for n in info.node_names if n != node)
    bmc_policy(api, "bmc-wrong")
    counts = {n: posts(info, n) for n in (node, other)}
    api.patch(
        f"/api/v1/nodes/{node}",
        {
            "metadata": {
                "annotations": {well_known.ANNOTATION_BMC_SECRET: f"{SYSTEM_NS}/bmc-{other}"}
            }
        },
    )
    try:
        with running(info, logs, policy="bmc-wrong"):
            report_fault(api, node, 79)
            wait_for("the step failed", lambda: any(s.outcome for s in tried(api, node)))
            first = tried(api, node)[0]
            assert first.outcome.value == "failed"
            assert f"HostName {other}, not {node}" in first.detail

            def condition() -> Any:
                conds = api.node(node)["status"].get("conditions") or []
                return next(
                    (
                        c
                        for c in conds
                        if c["type"] == well_known.CONDITION_BMC_MISMATCH and c["status"] == "True"
                    ),
                    None,
                )

            cond = wait_for("GpufleetBmcMismatch=True", condition)
            assert other in cond["message"]
            wait_for(
                "a BmcIdentityMismatch Event",
                lambda: any(e["reason"] == "BmcIdentityMismatch" for e in api.events(node)),
            )
            # Every BMC rung fails the same way: the node ends with people, nothing powered.
            wait_for("triage", lambda: api.state(node) == "triage", timeout=30)
        assert {n: posts(info, n) for n in (node, other)} == counts
    finally:
        bmc = info.bmcs[node]
        add_bmc_secret(api, node, bmc.url, bmc.user, bmc.password)
