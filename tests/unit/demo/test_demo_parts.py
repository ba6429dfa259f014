"""Pure parts of the demo: its policy, the job's work report, Node change detection."""

from __future__ import annotations

from gpufleet.demo import job, observe, policy
from gpufleet.domain.policy import load_policy


def test_demo_policy_is_the_default_with_short_times() -> None:
    spec = policy.demo_policy_spec()
    assert {e["timeoutSeconds"] for e in spec["ladder"]} == {60}
    assert spec["detection"]["clearAfterSeconds"] == 3
    xid79 = next(r for r in spec["rules"] if r["match"].get("xid") == 79)
    assert xid79["action"] == "reboot" and xid79["taint"] == "NoExecute"
    load_policy(policy.policy_yaml(spec), "demo")  # what the controller and agents read is valid


def test_rule_actions_change_only_that_rule() -> None:
    spec = policy.demo_policy_spec(xid79="power-cycle")
    actions = {r["match"].get("xid"): r["action"] for r in spec["rules"] if "xid" in r["match"]}
    assert actions[79] == "power-cycle" and actions[119] == "reboot"


def _events(fault_after: int, resume_at: int, steps: int = 10) -> list[dict]:
    ev: list[dict] = [{"kind": "start", "t": 0.0, "step": 0, "restart": 0}]
    t = 0.0
    for s in range(1, fault_after + 1):
        t += 0.5
        ev.append({"kind": "step", "t": t, "step": s, "restart": 0})
    t += 10.0  # detection, requeue, restart
    ev.append({"kind": "start", "t": t, "step": resume_at, "restart": 1})
    for s in range(resume_at + 1, steps + 1):
        t += 0.5
        ev.append({"kind": "step", "t": t, "step": s, "restart": 1})
    ev.append({"kind": "done", "t": t, "step": steps, "restart": 1})
    return ev


def test_work_report_counts_repeated_steps_and_the_stall() -> None:
    w = job.work_report(_events(fault_after=7, resume_at=5), steps=10)
    assert w is not None
    assert (w.steps_run, w.repeated, w.restarts, w.resumed_at) == (12, 2, 1, 5)
    assert w.step_s == 0.5
    assert abs(w.stalled_s - 10.0) < 1e-9
    assert abs(w.elapsed_s - 16.0) < 1e-9
    assert abs(w.goodput - 5.0 / 16.0) < 1e-9


def test_work_report_is_none_until_the_job_is_done() -> None:
    assert job.work_report(_events(7, 5)[:-1], steps=10) is None


def test_node_state_reads_our_conditions_taints_and_request() -> None:
    body = {
        "metadata": {
            "name": "n1",
            "labels": {"gpufleet.io/state": "verifying"},
            "annotations": {
                "gpufleet.io/agent-request": '{"id": "verify-1", "kind": "checks", '
                '"profile": "verify"}'
            },
        },
        "spec": {
            "unschedulable": True,
            "taints": [
                {"key": "gpufleet.io/unverified", "effect": "NoSchedule"},
                {"key": "example.com/other", "effect": "NoSchedule"},
            ],
        },
        "status": {
            "conditions": [
                {"type": "GpuProblem", "status": "True", "reason": "Xid79", "message": "m"},
                {"type": "Ready", "status": "True"},
            ]
        },
    }
    s = observe._node_state(body)
    assert s.state == "verifying" and s.unschedulable
    assert s.taints == {"gpufleet.io/unverified": "NoSchedule"}
    assert s.problems == {"GpuProblem": "Xid79: m"}
    assert s.request_kind == {"verify-1": "checks verify"}
    assert observe._kind_from_id("gpu-reset-1-2") == "gpu-reset"
    assert observe._evidence("xid79 gpu3 | evidence: [{}]") == "xid79 gpu3"
