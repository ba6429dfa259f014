"""The invariants fire on the writes and acts that break them, and only on those."""

from __future__ import annotations

import json
from dataclasses import replace

from gpufleet.domain import well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy
from gpufleet.domain.records import Incident, NodeRecord, Occurrence, StepAttempt, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.dst.bmc import BmcModel
from gpufleet.dst.invariants import POLICIES, Invariants
from gpufleet.dst.kube import node_body
from gpufleet.dst.scenario import NVLINK_DOMAIN, RACK, dst_policy, nvlink_domain_of, rack_of
from gpufleet.dst.world import Proc, World
from gpufleet.kubeapi import EVENTS, NODES, PODS, Patch

CTL = well_known.CONTROLLER


def _world() -> tuple[World, Invariants]:
    w = World(1, ["n1", "n2", "n3", "n4"], replay=[], shuffle=False)
    w.stop_on_violation = False
    for n in w.node_names:
        w.api.create("kubelet", NODES, node_body(n), None)
        w.add_bmc(BmcModel(node=n, endpoint=f"https://bmc-{n}", serial=f"SN-{n}"))
    inv = Invariants(w, dst_policy())
    inv.attach()
    return w, inv


def domain_world(policy: Policy) -> World:
    """Four nodes in two NVLink domains (n1, n3 in nvl72-0; n2, n4 in nvl72-1) under
    ``policy``, the invariants attached."""
    w = World(1, ["n1", "n2", "n3", "n4"], replay=[], shuffle=False)
    w.stop_on_violation = False
    for i, n in enumerate(w.node_names):
        body = node_body(n)
        body["metadata"]["labels"][NVLINK_DOMAIN] = nvlink_domain_of(i)
        w.api.create("kubelet", NODES, body, None)
    Invariants(w, policy).attach()
    return w


def _write(w: World, who: str, node: str, rec: NodeRecord, **labels: str) -> None:
    w.api.patch(
        who,
        NODES,
        node,
        {
            "metadata": {
                "annotations": {well_known.ANNOTATION_RECORD: record_to_json(rec)},
                "labels": {well_known.LABEL_STATE: rec.state.value, **labels},
            }
        },
    )


def _remediating(node: str, at: float) -> NodeRecord:
    inc = Incident(
        key="xid-79",
        description="x",
        opened_at=at,
        plan=Step.REBOOT,
        drained=True,
        current=Step.REBOOT,
        tried=(StepAttempt(Step.REBOOT, 1, at),),
    )
    return NodeRecord(name=node, state=NodeState.REMEDIATING, since=at, reason="r", incident=inc)


def test_a_reset_under_a_pod_and_a_second_reset_for_one_decision() -> None:
    w, _ = _world()
    _write(w, CTL, "n1", _remediating("n1", 100.0))
    ctl = Proc("ctl-1", CTL, 1, crashable=True)
    w.on_reset[0](ctl, w.bmc_of("n1"), "ForceOff", 0.0)
    w.on_reset[0](ctl, w.bmc_of("n1"), "On", 0.0)  # the second half of off + on
    assert w.violations == []
    w.api.create("user", PODS, {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}}, "w")
    w.on_reset[0](Proc("ctl-2", CTL, 1, crashable=True), w.bmc_of("n1"), "ForceRestart", 0.0)
    assert [v.category for v in w.violations] == ["2/two-replicas", "1/pod-after-drain"]


def test_a_pod_counts_from_the_gates_last_look_at_the_nodes_pods() -> None:
    """Decision 0147: a pod bound after the acting process last listed the node's pods is
    in flight (no look after it could see it); one bound before that look is a violation,
    and so is one bound after a look too old to be the act's own."""
    w, inv = _world()
    ctl = Proc("ctl-1", CTL, 1, crashable=True)
    cases = {"n1": (10.0, 10.5), "n2": (10.0, 9.5), "n3": (5.0, 5.5)}  # node: (look, pod)
    for node, (look, born) in cases.items():
        _write(w, CTL, node, _remediating(node, 100.0))
        w.api.create("user", PODS, {"metadata": {"name": node}, "spec": {"nodeName": node}}, "w")
        inv.pod_born[f"w/{node}"] = born
        w.pod_looks[(ctl.label, node)] = look
        w.on_reset[0](ctl, w.bmc_of(node), "ForceRestart", 11.0)  # sent at 11.0
    assert [(v.node, v.invariant) for v in w.violations if v.invariant == "1"] == [
        ("n2", "1"),
        ("n3", "1"),
    ]
    assert [node for _, node in inv.in_flight] == ["n1"]


def _held_then_dropped(w: World, *, via: NodeState) -> None:
    """n1 holds a fault in production, then a record without it is written (through ``via``)."""
    fault = FaultEvent(
        FaultKind.XID, "n1", 5.0, xid=48, evidence=Evidence(gpu_index=0, counters={})
    )
    held = NodeRecord(name="n1", state=NodeState.PRODUCTION, since=1.0, reason="r", pending=fault)
    _write(w, CTL, "n1", held)
    if via is not NodeState.PRODUCTION:
        _write(w, CTL, "n1", replace(held, state=via))
    _write(w, CTL, "n1", NodeRecord(name="n1", state=NodeState.PRODUCTION, since=9.0, reason="r"))


def test_a_held_fault_dropped_without_a_notice() -> None:
    w, _ = _world()
    _held_then_dropped(w, via=NodeState.VERIFYING)
    w.loop.run_until(w.loop.time() + 11)
    assert [v.category for v in w.violations] == ["3a/to-production"]


def test_a_held_fault_let_go_whose_notice_never_came() -> None:
    w, _ = _world()
    _held_then_dropped(w, via=NodeState.PRODUCTION)
    w.loop.run_until(w.loop.time() + 11)
    assert [v.category for v in w.violations] == ["3a/let-go-notice-lost"]


def test_a_notice_excuses_the_drop() -> None:
    w, _ = _world()
    _held_then_dropped(w, via=NodeState.PRODUCTION)
    w.api.create(
        CTL,
        EVENTS,
        {
            "metadata": {"name": "e"},
            "reason": "Notice",
            "message": "held fault xid-48 let go",
            "involvedObject": {"name": "n1"},
        },
        "default",
    )
    w.loop.run_until(w.loop.time() + 11)
    assert w.violations == []


def test_the_budget_counts_gpufleet_state_labels() -> None:
    w, _ = _world()
    for n in ("n1", "n2"):
        _write(w, CTL, n, _remediating(n, 1.0))
    _write(w, "intruder", "n3", _remediating("n3", 1.0))  # not gpufleet's label
    assert w.violations == []
    _write(w, CTL, "n4", _remediating("n4", 1.0))
    assert [v.invariant for v in w.violations] == ["4"]


def test_a_group_budget_counts_the_groups_nodes() -> None:
    """With the override of rack a (its own budget: 1), a second node of rack a out breaks
    invariant 4 though the pool's budget (2 of 4) has room; a node of rack b does not."""
    w = World(1, ["n1", "n2", "n3", "n4"], replay=[], shuffle=False)
    w.stop_on_violation = False
    for i, n in enumerate(w.node_names):
        body = node_body(n)
        body["metadata"]["labels"][RACK] = rack_of(i, 4)
        w.api.create("kubelet", NODES, body, None)
    Invariants(w, dst_policy(groups=True)).attach()
    _write(w, CTL, "n1", _remediating("n1", 1.0))
    _write(w, CTL, "n3", _remediating("n3", 1.0))
    assert w.violations == []
    _write(w, CTL, "n3", replace(_remediating("n3", 1.0), state=NodeState.PRODUCTION))
    _write(w, CTL, "n2", _remediating("n2", 1.0))
    assert [v.invariant for v in w.violations] == ["4"]
    assert "2 nodes of group rack-a out of service" in w.violations[0].text


def test_a_domain_budget_counts_the_domains_nodes() -> None:
    """With a per-domain budget of one node, a second node of one NVLink domain out breaks
    invariant 4 though the pool's budget (2 of 4) has room; one of each domain does not."""
    w = domain_world(dst_policy(domains=True))
    _write(w, CTL, "n1", _remediating("n1", 1.0))  # nvl72-0
    _write(w, CTL, "n2", _remediating("n2", 1.0))  # nvl72-1
    assert w.violations == []
    _write(w, CTL, "n2", replace(_remediating("n2", 1.0), state=NodeState.PRODUCTION))
    _write(w, CTL, "n3", _remediating("n3", 1.0))  # nvl72-0 again
    assert [v.invariant for v in w.violations] == ["4"]
    assert "2 nodes of domain nvl72-0 out of service" in w.violations[0].text


def test_gpufleet_may_not_clear_an_admins_taint_or_cordon() -> None:
    w, _ = _world()
    w.api.patch("admin", NODES, "n1", {"spec": {"unschedulable": True, "taints": [{"key": "x"}]}})
    w.api.patch(
        "gpufleet-slurm-syncer", NODES, "n1", {"spec": {"taints": [{"key": "gpufleet.io/slurm"}]}}
    )
    w.api.patch(CTL, NODES, "n1", {"spec": {"unschedulable": None}})
    texts = [v.text for v in w.violations]
    assert len(texts) == 2 and "taint x (removed)" in texts[0]
    assert "someone else's cordon" in texts[1]


def test_a_raised_fault_the_controller_never_saw() -> None:
    w, inv = _world()
    fault = FaultEvent(
        FaultKind.XID, "n1", 1_800_000_050.0, xid=79, evidence=Evidence(gpu_index=0, counters={})
    )
    from gpufleet.domain import conditions

    report = conditions.problem(fault.subsystem, [fault])
    cond = {"type": report.type, "status": report.status, "message": report.message}
    patch = {"status": {"conditions": [cond]}}
    w.api.patch("gpufleet-agent:n1", NODES, "n1", patch, status=True, kind=Patch.STRATEGIC)
    inv.check_end()
    assert [v.invariant for v in w.violations] == ["3b"]
    w.violations.clear()
    seen = {report.type: fault.at}
    w.api.patch(
        CTL,
        NODES,
        "n1",
        {"metadata": {"annotations": {well_known.ANNOTATION_FAULTS_SEEN: json.dumps(seen)}}},
    )
    inv.check_end()
    assert w.violations == []


def _isolation_after_a_trip(decided_at: float) -> list[str]:
    """The breaker trips on n2's fault at t=10 (its status saved); n4's isolation lands at
    t=12, decided at ``decided_at`` (its incident opens then). The violations it draws."""
    w, _ = _world()
    wall = w.clock.now() - w.loop.time()  # wall time at t=0
    w.api.create(CTL, POLICIES, {"metadata": {"name": "default"}}, None)
    w.loop.run_until(10.0)
    fault = Occurrence("xid-48", "node", wall + 10.0)
    _write(w, CTL, "n2", NodeRecord("n2", NodeState.PRODUCTION, 1.0, "r", occurrences=(fault,)))
    breaker = {"open": True, "trippedAt": wall + 10.0, "lastFaultAt": wall + 10.0}
    w.api.patch(CTL, POLICIES, "default", {"status": {"breaker": breaker}}, status=True)
    w.loop.run_until(12.0)
    incident = Incident(
        key="xid-79", description="x", opened_at=wall + decided_at, plan=Step.REBOOT
    )
    isolated = NodeRecord("n4", NodeState.DRAINING, wall + 12.0, "r", incident=incident)
    _write(w, CTL, "n4", isolated)
    return [v.invariant for v in w.violations]


def test_an_isolation_decided_after_the_breaker_tripped_breaks_5a() -> None:
    assert _isolation_after_a_trip(decided_at=11.0) == ["5a"]


def test_an_isolation_decided_before_the_trip_whose_write_lands_after_it_is_allowed() -> None:
    """Seed 67 of ``bench/dst_soak.py``: decided 0.8 s before the fault that tripped the
    breaker, written 1.7 s after it; the breaker let it through (it counted it)."""
    assert _isolation_after_a_trip(decided_at=9.0) == []
