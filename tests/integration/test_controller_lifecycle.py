"""The lifecycle controller against the local cluster: real apiserver, KWOK nodes,
Redfish BMCs. The tests play the node agent (problem conditions, request results).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    answer_request,
    bmc_counters,
    create_kwok_nodes,
    policy_spec,
    put_policy,
    report_fault,
    reset_node,
    running,
    wait_for,
)
from fleet import Fleet

from gpufleet.domain import well_known
from gpufleet.domain.faults import Subsystem

pytestmark = pytest.mark.integration

STORM_NODES = [f"storm-{i:02d}" for i in range(20)]


@pytest.fixture(scope="module")
def env(fleet: Fleet) -> Iterator[tuple[Any, Api, Path]]:
    api = fleet.api
    try:
        yield fleet.info, api, fleet.logs
    finally:
        for node in STORM_NODES:
            api.delete(f"/api/v1/nodes/{node}")
        for item in api.get(f"{GV}/fleetpolicies")["items"]:
            api.delete(f"{GV}/fleetpolicies/{item['metadata']['name']}")
        api.delete(f"{GV}/noderemediations")


def taints(api: Api, node: str) -> dict[str, str]:
    return {t["key"]: t["effect"] for t in api.node(node)["spec"].get("taints") or []}


def test_fault_walks_the_ladder_on_the_right_bmc_and_returns_only_our_marks(env: Any) -> None:
    info, api, logs = env
    node = info.node_names[1]
    others = {n: bmc_counters(info, n)["ResetCount"] for n in info.node_names if n != node}
    before = bmc_counters(info, node)
    admin = {"key": "example.com/maintenance-window", "value": "x", "effect": "PreferNoSchedule"}
    api.patch(f"/api/v1/nodes/{node}", {"spec": {"taints": [admin]}})
    put_policy(api, "ladder", policy_spec())
    with running(info, logs, policy="ladder") as ctl:
        report_fault(api, node, 79)  # XID 79: NoExecute taint, ladder starts at reboot
        wait_for("cordon", lambda: api.node(node)["spec"].get("unschedulable"), timeout=10)
        got = taints(api, node)
        assert got[well_known.TAINT_UNHEALTHY] == "NoExecute" and admin["key"] in got
        ann = api.node(node)["metadata"]["annotations"]
        assert ann[well_known.ANNOTATION_CORDONED] == well_known.CONTROLLER
        # No workload on the node: drained at once, reboot through the BMC, then verify.
        wait_for("verifying after reboot", lambda: api.state(node) == "verifying")
        after_reboot = bmc_counters(info, node)
        assert after_reboot["ResetCount"] == before["ResetCount"] + 1
        assert after_reboot["LastResetType"] == "GracefulRestart"
        assert taints(api, node)[well_known.TAINT_UNVERIFIED] == "NoSchedule"
        # Verification fails: the ladder escalates to a power cycle, on this node's BMC only.
        assert answer_request(api, node, passed=False, detail="gemm 41% below") == "checks"
        wait_for(
            "power cycle",
            lambda: bmc_counters(info, node)["ResetCount"] == before["ResetCount"] + 2,
        )
        assert bmc_counters(info, node)["LastResetType"] == "PowerCycle"
        wait_for("verifying after power cycle", lambda: api.state(node) == "verifying")
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production")
        n = api.node(node)
        assert not n["spec"].get("unschedulable")
        system = "node.kubernetes.io/"  # kube-controller-manager's mirror of the cordon
        assert [t for t in n["spec"]["taints"] if not t["key"].startswith(system)] == [admin]
        assert well_known.ANNOTATION_CORDONED not in n["metadata"]["annotations"]
        assert {x: bmc_counters(info, x)["ResetCount"] for x in others} == others
        rec = api.record(node)
        assert rec is not None
        assert [t.target.value for t in rec.history][-6:] == [
            "draining",
            "remediating",
            "verifying",
            "remediating",
            "verifying",
            "production",
        ]
        nrem = api.get(f"{GV}/noderemediations?labelSelector=gpufleet.io%2Fnode%3D{node}")["items"]
        done = wait_for(
            "NodeRemediation succeeded",
            lambda: [
                r
                for r in api.get(
                    f"{GV}/noderemediations?labelSelector=gpufleet.io%2Fnode%3D{node}"
                )["items"]
                if (r.get("status") or {}).get("outcome") == "repaired"
            ],
        )
        # The newest: earlier modules on this cluster may have repaired this node before.
        latest = max(done, key=lambda r: r["metadata"]["creationTimestamp"])
        assert nrem and [s["step"] for s in latest["status"]["steps"]] == ["reboot", "power-cycle"]
        wanted = {"Cordoned", "StateChanged", "StepStarted", "Uncordoned"}
        wait_for("Events", lambda: wanted <= {e["reason"] for e in api.events(node)})
        assert (ctl.metric('gpufleet_nodes{state="production"}') or 0) >= 1
        assert ctl.metric("gpufleet_time_to_cordon_seconds_count") == 1
    reset_node(api, node)


def test_an_admins_cordon_is_left_alone(env: Any) -> None:
    info, api, logs = env
    node = info.node_names[2]
    api.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})
    put_policy(api, "admin", policy_spec())
    with running(info, logs, policy="admin"):
        report_fault(api, node, 48, Subsystem.GPU)  # XID 48: GPU reset, asked of the agent
        wait_for("gpu reset requested", lambda: api.state(node) == "remediating")
        assert answer_request(api, node, passed=True) == "gpu-reset"
        wait_for("verifying", lambda: api.state(node) == "verifying")
        answer_request(api, node, passed=True)
        wait_for("production", lambda: api.state(node) == "production")
        n = api.node(node)
        assert n["spec"].get("unschedulable") is True  # still the admin's cordon
        assert not any(t["key"].startswith("gpufleet.io/") for t in n["spec"].get("taints") or [])
        wait_for("CordonKept", lambda: "CordonKept" in {e["reason"] for e in api.events(node)})
    reset_node(api, node)


def test_a_storm_is_capped_by_the_budget_and_trips_the_breaker(env: Any) -> None:
    info, api, logs = env
    create_kwok_nodes(api, STORM_NODES, pool="storm")
    base = {n: bmc_counters(info, n)["ResetCount"] for n in info.node_names}
    put_policy(api, "storm", policy_spec())
    with running(info, logs, policy="storm") as ctl:
        faulty = STORM_NODES[: int(0.3 * (len(STORM_NODES) + len(info.node_names))) + 1]
        for node in faulty:
            report_fault(api, node, 79)
        wait_for(
            "breaker open",
            lambda: (
                (api.get(f"{GV}/fleetpolicies/storm").get("status") or {})
                .get("breaker", {})
                .get("open")
            ),
            timeout=15,
        )
        # Events are posted in the background after the record write (lifecycle/events.py).
        wait_for(
            "a breaker-open ActionWithheld Event",
            lambda: any(
                e["reason"] == "ActionWithheld" and "breaker-open" in e["message"]
                for n in faulty
                for e in api.events(n)
            ),
        )
        out = [n for n in STORM_NODES if api.node(n)["spec"].get("unschedulable")]
        assert len(out) <= 2  # 10% of the 20-node pool
        assert all(api.state(n) in (None, "production") for n in info.node_names)
        assert ctl.metric("gpufleet_breaker_open") == 1
        assert {n: bmc_counters(info, n)["ResetCount"] for n in info.node_names} == base
        status = api.get(f"{GV}/fleetpolicies/storm")["status"]
        assert status["breaker"]["faultingNodes"] >= 3
    for node in STORM_NODES:
        api.delete(f"/api/v1/nodes/{node}")


def test_killed_mid_remediation_the_controller_resumes_without_a_second_power_cycle(
    env: Any,
) -> None:
    info, api, logs = env
    node = info.node_names[3]
    spec = policy_spec()
    spec["rules"] = [
        {**r, "action": "power-cycle"} if r["match"].get("xid") == 79 else r for r in spec["rules"]
    ]
    put_policy(api, "resume", spec)
    before = bmc_counters(info, node)["ResetCount"]
    with running(info, logs, policy="resume") as first:
        report_fault(api, node, 79)
        wait_for("power cycle done", lambda: api.state(node) == "verifying")
        first.kill()
    assert bmc_counters(info, node)["ResetCount"] == before + 1
    with running(info, logs, policy="resume"):
        answer_request(api, node, passed=True)
        wait_for("production after restart", lambda: api.state(node) == "production")
    assert bmc_counters(info, node)["ResetCount"] == before + 1
    assert bmc_counters(info, node)["LastResetType"] == "PowerCycle"
    reset_node(api, node)


def test_an_invalid_fleet_policy_is_rejected_by_the_apiserver(env: Any) -> None:
    _, api, _ = env
    spec = policy_spec()
    spec["safety"]["breaker"]["windowSeconds"] = -5
    spec["drain"]["mode"] = "yolo"
    r = api.http.post(
        f"{GV}/fleetpolicies",
        json={
            "apiVersion": f"{well_known.GROUP}/{well_known.VERSION}",
            "kind": "FleetPolicy",
            "metadata": {"name": "bad"},
            "spec": spec,
        },
    )
    assert r.status_code == 422, r.text
    message = r.json()["message"]
    assert "spec.safety.breaker.windowSeconds" in message and "spec.drain.mode" in message
    assert "yolo" in message


def test_a_policy_the_apiserver_accepts_but_the_controller_cannot_use_is_reported(
    env: Any,
) -> None:
    info, api, logs = env
    spec = policy_spec()
    spec["ladder"][0]["onFailure"] = spec["ladder"][0]["step"]  # a cycle
    put_policy(api, "cyclic", policy_spec())
    with running(info, logs, policy="cyclic"):
        api.patch(f"{GV}/fleetpolicies/cyclic", {"spec": {"ladder": spec["ladder"]}})

        def valid() -> Any:
            conds = (api.get(f"{GV}/fleetpolicies/cyclic").get("status") or {}).get(
                "conditions", []
            )
            return next((c for c in conds if c["type"] == "Valid" and c["status"] == "False"), None)

        cond = wait_for("Valid=False", valid)
        assert "cycle" in cond["message"] and "kept the last valid policy" in cond["message"]


@pytest.mark.parametrize("switch", ["paused", "dryRun"])
def test_pause_and_dry_run_are_honoured(env: Any, switch: str) -> None:
    info, api, logs = env
    node = info.node_names[0]
    put_policy(api, f"switch-{switch.lower()}", policy_spec(**{switch: True}))
    with running(info, logs, policy=f"switch-{switch.lower()}"):
        report_fault(api, node, 79)
        hold = "paused" if switch == "paused" else "dry-run"

        def pending() -> Any:
            rec = api.record(node)
            return rec is not None and rec.pending is not None  # the fact is kept for later

        wait_for("the held fault recorded", pending, timeout=10)
        wait_for(
            "an ActionWithheld Event",
            lambda: any(
                e["reason"] == "ActionWithheld" and e["message"].startswith(f"{hold}:")
                for e in api.events(node)
            ),
        )
        assert not api.node(node)["spec"].get("unschedulable")
        assert api.state(node) == "production"
        api.patch(f"{GV}/fleetpolicies/switch-{switch.lower()}", {"spec": {switch: False}})
        wait_for("cordon after resuming", lambda: api.node(node)["spec"].get("unschedulable"))
    reset_node(api, node)


def test_two_replicas_one_lease_only_the_holder_acts_and_the_other_takes_over(env: Any) -> None:
    """One acting replica (docs/decisions/0141): two processes on one Lease; only its holder
    acts; SIGKILLed, the other takes over once the lease ran out, and acts once."""
    info, api, logs = env
    first, second = info.node_names[0], info.node_names[1]
    for node in (first, second):
        reset_node(api, node)
    put_policy(api, "ha", policy_spec())
    before = {n: bmc_counters(info, n)["ResetCount"] for n in (first, second)}
    leader = "gpufleet_controller_leader"
    with (
        running(info, logs, policy="ha", lease="ha") as a,
        running(info, logs, policy="ha", lease="ha", wait_policy=False) as b,
    ):

        def one_leader() -> tuple[Any, Any] | None:
            states = (a.metric(leader), b.metric(leader))
            if sorted(v or 0.0 for v in states) != [0.0, 1.0]:
                return None
            return (a, b) if states[0] == 1.0 else (b, a)

        holder, standby = wait_for("one replica holds the lease", one_leader, timeout=30)
        report_fault(api, first, 79)
        wait_for("verifying", lambda: api.state(first) == "verifying", timeout=60)
        acted = 'gpufleet_actions_total{action="cordon",result="ok"}'
        assert holder.metric(acted) == 1
        assert not standby.metric(acted)
        answer_request(api, first, passed=True)
        wait_for("production", lambda: api.state(first) == "production")
        holder.kill()  # no release: the standby waits for the lease to run out
        wait_for("the standby took over", lambda: standby.metric(leader) == 1.0, timeout=30)
        report_fault(api, second, 79)
        wait_for("verifying", lambda: api.state(second) == "verifying", timeout=60)
        answer_request(api, second, passed=True)
        wait_for("production", lambda: api.state(second) == "production")
    after = {n: bmc_counters(info, n)["ResetCount"] for n in (first, second)}
    assert after == {n: before[n] + 1 for n in before}  # one reset each, by one replica
    for node in (first, second):
        reset_node(api, node)
