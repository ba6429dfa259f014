"""Rolling maintenance (domain.maintenance): batch choice and node progress, through decide()."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain import events as ev
from gpufleet.domain import maintenance as mt
from gpufleet.domain.actions import ActionKind
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import Policy, RequeueMode, default_policy
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import OUT_OF_SERVICE, NodeState

from .conftest import Fleet, make_fleet

S = NodeState
P = mt.NodePhase


def cand(
    name: str, domain: str = "", phase: P = P.PENDING, state: S = S.PRODUCTION
) -> mt.Candidate:
    return mt.Candidate(name=name, pool="default", domain=domain, state=state, phase=phase)


def test_a_batch_takes_one_node_per_domain_within_max_unavailable_and_the_budget() -> None:
    nodes = [cand("a1", "r1"), cand("a2", "r1"), cand("b1", "r2"), cand("c1", "r3")]
    batch = mt.next_batch(mt.Rollout(max_unavailable=2), nodes, {"default": 5}, now=0.0)
    assert batch.start == ("a1", "b1")
    batch = mt.next_batch(mt.Rollout(max_unavailable=5), nodes, {"default": 2}, now=0.0)
    assert batch.start == ("a1", "b1")
    batch = mt.next_batch(
        mt.Rollout(max_unavailable=5, max_per_domain=2), nodes, {"default": 9}, now=0.0
    )
    assert batch.start == ("a1", "a2", "b1", "c1")
    assert mt.next_batch(mt.Rollout(), nodes, {}, now=0.0).start == ()


def test_a_batch_never_takes_more_than_the_fleet_budget_leaves() -> None:
    """Decision 0174: a node is held to its pool's budget and the fleet's. Two pools with
    room each, a fleet allowed 3 out with 1 out and 1 in maintenance: one node starts."""
    budget = default_policy().safety.budget.model_copy(update={"fleet_max_nodes": 3})
    room = mt.fleet_budget_room(budget, fleet_size=40, out_of_service=1, in_maintenance=1)
    assert room == 1
    nodes = [
        mt.Candidate(name=n, pool=pool, domain=n, state=S.PRODUCTION, phase=P.PENDING)
        for n, pool in (("a1", "a"), ("b1", "b"), ("b2", "b"))
    ]
    pools = {"a": 5, "b": 5}
    rollout = mt.Rollout(max_unavailable=5)
    assert mt.next_batch(rollout, nodes, pools, now=0.0, fleet_room=room).start == ("a1",)
    full = mt.next_batch(rollout, nodes, pools, now=0.0, fleet_room=0)
    assert full.start == () and full.why == "waiting: no budget room in the fleet"
    # No fleet-wide limit in the policy: the pools' room alone.
    assert mt.fleet_budget_room(default_policy().safety.budget, 40, 39) is None
    assert len(mt.next_batch(rollout, nodes, pools, now=0.0, fleet_room=None).start) == 3


def test_nothing_starts_while_a_node_of_the_batch_is_not_verified() -> None:
    nodes = [cand("a", "r1", P.VERIFYING), cand("b", "r2")]
    batch = mt.next_batch(mt.Rollout(max_unavailable=4), nodes, {"default": 4}, now=0.0)
    assert batch.start == () and "in progress" in batch.why


def test_paused_aborted_and_stopped_plans_start_nothing() -> None:
    nodes = [cand("a"), cand("b", phase=P.FAILED), cand("c")]
    assert (
        mt.next_batch(mt.Rollout(paused=True, max_failures=2), nodes, {"default": 9}, now=0.0).start
        == ()
    )
    assert (
        mt.next_batch(
            mt.Rollout(aborted=True, max_failures=2), nodes, {"default": 9}, now=0.0
        ).start
        == ()
    )
    stopped = mt.next_batch(mt.Rollout(max_failures=1), nodes, {"default": 9}, now=0.0)
    assert stopped.start == () and stopped.why.startswith("stopped")
    assert (
        mt.plan_phase(mt.Rollout(max_failures=1), [P.PENDING, P.FAILED], now=0.0)
        is mt.PlanPhase.STOPPED
    )
    assert mt.plan_phase(mt.Rollout(max_failures=2), [P.SUCCEEDED, P.FAILED], now=0.0) is (
        mt.PlanPhase.COMPLETED
    )


def test_nothing_starts_before_the_start_time() -> None:
    nodes = [cand("a"), cand("b")]
    rollout = mt.Rollout(start_at=1000.0)
    early = mt.next_batch(rollout, nodes, {"default": 9}, now=999.0)
    assert early.start == () and "start time" in early.why
    assert mt.plan_phase(rollout, [P.PENDING, P.PENDING], now=999.0) is mt.PlanPhase.SCHEDULED
    assert mt.next_batch(rollout, nodes, {"default": 9}, now=1000.0).start == ("a",)
    assert mt.plan_phase(rollout, [P.DRAINING, P.PENDING], now=999.0) is (mt.PlanPhase.PROGRESSING)


def test_nodes_not_in_production_wait() -> None:
    nodes = [cand("a", state=S.REMEDIATING), cand("b", state=S.TRIAGE)]
    batch = mt.next_batch(mt.Rollout(), nodes, {"default": 9}, now=0.0)
    assert batch.start == () and "not in production" in batch.why


def test_the_room_counts_nodes_held_in_maintenance() -> None:
    budget = default_policy().safety.budget
    allowed = budget.allowed(20)
    assert mt.budget_room(budget, 20, 0) == allowed
    assert mt.budget_room(budget, 20, allowed - 1, in_maintenance=1) == 0


def test_a_reimage_node_goes_out_reimages_verifies_and_returns() -> None:
    f = make_fleet(4)
    req = mt.request("fw", mt.Action.REIMAGE, image="v2")
    d = f.send("n1", req, now=10)
    assert f.state("n1") is S.DRAINING
    assert d.actions[1].kind is ActionKind.DRAIN and d.actions[1].requeue is RequeueMode.LET_FINISH
    rec = f.records["n1"]
    assert rec.incident is not None and rec.incident.key == "maintenance:fw"
    assert rec.incident.requeue is RequeueMode.LET_FINISH
    assert mt.node_phase(rec, "fw", P.REQUESTED, 10).phase is P.DRAINING
    d = f.send("n1", ev.DrainCompleted(), now=20)
    assert [(a.kind, a.step) for a in d.actions] == [(ActionKind.RUN_STEP, Step.REIMAGE)]
    assert mt.node_phase(f.records["n1"], "fw", P.DRAINING, 10).phase is P.UPDATING
    f.send("n1", ev.StepCompleted(Step.REIMAGE, succeeded=True), now=30)
    assert mt.node_phase(f.records["n1"], "fw", P.UPDATING, 10).phase is P.VERIFYING
    f.send("n1", ev.ChecksCompleted(passed=True), now=40)
    assert f.state("n1") is S.PRODUCTION
    assert mt.node_phase(f.records["n1"], "fw", P.VERIFYING, 10).phase is P.SUCCEEDED


def test_a_failed_verification_fails_the_node_and_the_ladder_keeps_it() -> None:
    f = make_fleet(4)
    f.send("n1", mt.request("fw", mt.Action.REBOOT), now=10)
    f.send("n1", ev.DrainCompleted(), now=20)
    f.send("n1", ev.StepCompleted(Step.REBOOT, succeeded=True), now=30)
    f.send("n1", ev.ChecksCompleted(passed=False, detail="gemm low"), now=40)
    progress = mt.node_phase(f.records["n1"], "fw", P.VERIFYING, 10)
    assert progress.phase is P.FAILED and "verification failed" in progress.message
    assert f.state("n1") is S.REMEDIATING  # the ladder's next rung, not left cordoned


def test_a_noop_node_waits_in_maintenance_until_the_plan_completes_it() -> None:
    f = make_fleet(4)
    f.send("n1", mt.request("fw", mt.Action.NOOP), now=10)
    f.send("n1", ev.DrainCompleted(), now=20)
    assert f.state("n1") is S.MAINTENANCE
    assert mt.awaits_completion(f.records["n1"], "fw")
    assert not mt.awaits_completion(f.records["n1"], "other")
    f.send("n1", mt.completion("fw"), now=30)
    assert f.state("n1") is S.VERIFYING


def test_phase_before_and_after_a_start() -> None:
    f = make_fleet(2)
    assert mt.node_phase(f.records["n0"], "fw", P.PENDING, None).phase is P.PENDING
    assert mt.node_phase(f.records["n0"], "fw", P.REQUESTED, 5).phase is P.REQUESTED
    assert mt.node_phase(None, "fw", P.REQUESTED, 5).phase is P.FAILED
    assert mt.node_phase(None, "fw", P.SUCCEEDED, 5).phase is P.SUCCEEDED
    # An earlier run of a plan of the same name does not count for a later start.
    for e, t in ((mt.request("fw", mt.Action.NOOP), 1), (ev.DrainCompleted(), 2)):
        f.send("n0", e, now=t)
    f.send("n0", mt.completion("fw"), now=3)
    f.send("n0", ev.ChecksCompleted(passed=True), now=4)
    assert mt.node_phase(f.records["n0"], "fw", P.REQUESTED, 100).phase is P.REQUESTED
    assert mt.node_phase(f.records["n0"], "fw", P.REQUESTED, 1).phase is P.SUCCEEDED


# ----------------------------------------------------------- a whole rollout


def _room(f: Fleet, policy: Policy) -> dict[str, int]:
    view = f.view
    maint = Counter(r.pool for r in f.records.values() if r.state is S.MAINTENANCE)
    return {
        name: mt.budget_room(policy.safety.budget, p.size, p.out_of_service, maint[name])
        for name, p in view.pools.items()
    }


def _advance(f: Fleet, plan: str, node: str, now: float, passes: bool) -> None:
    r = f.records[node]
    if r.state is S.DRAINING:
        f.send(node, ev.DrainCompleted(), now)
    elif r.state is S.REMEDIATING and r.incident is not None and r.incident.current:
        f.send(node, ev.StepCompleted(r.incident.current, succeeded=True), now)
    elif r.state is S.MAINTENANCE and mt.command_of(r) is not None:
        f.send(node, mt.command_answered(r, passed=True, detail="flashed"), now)
    elif r.state is S.MAINTENANCE and mt.awaits_completion(r, plan):
        f.send(node, mt.completion(plan), now)
    elif r.state is S.VERIFYING:
        f.send(node, ev.ChecksCompleted(passed=passes), now)


@settings(max_examples=60, deadline=None)
@given(
    domains=st.lists(st.sampled_from(["r1", "r2", "r3", ""]), min_size=1, max_size=12),
    budget=st.integers(min_value=1, max_value=4),
    max_unavailable=st.integers(min_value=1, max_value=4),
    max_per_domain=st.integers(min_value=1, max_value=2),
    max_failures=st.integers(min_value=1, max_value=3),
    action=st.sampled_from(list(mt.Action)),
    failing=st.sets(st.integers(min_value=0, max_value=11), max_size=3),
)
def test_a_rollout_respects_budget_and_domains_and_ends_every_node(
    domains: list[str],
    budget: int,
    max_unavailable: int,
    max_per_domain: int,
    max_failures: int,
    action: mt.Action,
    failing: set[int],
) -> None:
    base = default_policy()
    safety = base.safety.model_copy(
        update={
            "budget": base.safety.budget.model_copy(
                update={"max_nodes": budget, "min_nodes": budget}
            )
        }
    )
    policy = base.model_copy(update={"safety": safety})
    f = make_fleet(len(domains), policy)
    domain_of = {f"n{i}": d for i, d in enumerate(domains)}
    rollout = mt.Rollout(
        max_unavailable=max_unavailable, max_per_domain=max_per_domain, max_failures=max_failures
    )
    stored = {n: P.PENDING for n in domain_of}
    started: dict[str, float | None] = dict.fromkeys(domain_of)
    verified_once: set[str] = set()
    now = 100.0
    allowed = policy.safety.budget.allowed(len(domains))
    for _ in range(400):
        now += 1.0
        for n in domain_of:
            stored[n] = mt.node_phase(f.records[n], "p", stored[n], started[n]).phase
        busy = [n for n in domain_of if stored[n] in mt.IN_PROGRESS]
        assert len(busy) <= max_unavailable
        assert max(Counter(domain_of[n] for n in busy).values(), default=0) <= max_per_domain
        out = sum(
            1 for r in f.records.values() if r.state in OUT_OF_SERVICE or r.state is S.MAINTENANCE
        )
        assert out <= allowed
        cands = [
            mt.Candidate(n, "default", domain_of[n], f.records[n].state, stored[n])
            for n in domain_of
        ]
        phase = mt.plan_phase(rollout, stored.values(), now=0.0)
        if phase in (mt.PlanPhase.COMPLETED, mt.PlanPhase.STOPPED) and not busy:
            break
        for n in mt.next_batch(rollout, cands, _room(f, policy), now=0.0).start:
            started[n] = now
            stored[n] = P.REQUESTED
            command = "fw-update" if action is mt.Action.COMMAND else None
            f.send(n, mt.request("p", action, command=command), now + 0.1)
        for i, n in enumerate(domain_of):
            first = n not in verified_once and f.records[n].state is S.VERIFYING
            if first:
                verified_once.add(n)
            _advance(f, "p", n, now + 0.2, passes=not (first and i in failing))
    final = mt.plan_phase(rollout, stored.values(), now=0.0)
    failed = sum(1 for p in stored.values() if p is P.FAILED)
    if final is mt.PlanPhase.STOPPED:
        assert failed >= max_failures
    else:
        assert final is mt.PlanPhase.COMPLETED
        assert all(p in mt.FINISHED for p in stored.values())
        assert failed == sum(1 for i in failing if i < len(domains))
    for n, p in stored.items():
        if p is P.SUCCEEDED:
            assert f.records[n].state is S.PRODUCTION


def test_records_round_trip_the_plan_fields() -> None:
    from gpufleet.domain.records import record_from_json, record_to_json

    f = make_fleet(1)
    f.send("n0", mt.request("fw", mt.Action.REIMAGE, image="v9"), now=1)
    rec: NodeRecord = f.records["n0"]
    assert record_from_json(record_to_json(rec)) == rec


# ------------------------------------------------------- a command plan's node


def _in_maintenance(f: Fleet, node: str, command: str = "fw-update") -> NodeRecord:
    f.send(node, mt.request("fw", mt.Action.COMMAND, command=command, command_timeout_s=600), 10)
    d = f.send(node, ev.DrainCompleted(), now=20)
    assert f.state(node) is S.MAINTENANCE
    assert [(a.kind, a.detail, a.timeout_seconds) for a in d.actions] == [
        (ActionKind.RUN_COMMAND, command, 600)
    ]
    return f.records[node]


def test_a_command_node_asks_its_agent_for_the_command_its_record_names() -> None:
    from gpufleet.domain import agent_requests

    f = make_fleet(2)
    record = _in_maintenance(f, "n1")
    assert mt.command_of(record) == "fw-update" and mt.plan_of(record) == "fw"
    req = agent_requests.issue(record, "command", timeout_s=600)
    assert req is not None and req.command == "fw-update" and req.timeout_s == 600
    assert agent_requests.refusal(req, "n1", record) is None
    # An annotation edited to name another installed command is refused.
    from dataclasses import replace

    edited = replace(req, command="wipe-disks")
    why = agent_requests.refusal(edited, "n1", record)
    assert why is not None and "'wipe-disks'" in why and "'fw-update'" in why
    # A noop plan's node, and a node in production, ask no command.
    f.send("n0", mt.request("other", mt.Action.NOOP), now=10)
    f.send("n0", ev.DrainCompleted(), now=20)
    assert mt.command_of(f.records["n0"]) is None
    assert agent_requests.issue(f.records["n0"], "command") is None


def test_an_answered_command_verifies_the_node_and_a_failed_one_sends_it_to_triage() -> None:
    f = make_fleet(3)
    record = _in_maintenance(f, "n1")
    f.send("n1", mt.command_answered(record, passed=True, detail="exit 0"), now=30)
    assert f.state("n1") is S.VERIFYING
    f = make_fleet(3)  # the budget of a 3-node fleet lets one node out at a time
    record = _in_maintenance(f, "n2")
    f.send("n2", mt.command_answered(record, passed=False, detail="exit 3: no image"), now=30)
    assert f.state("n2") is S.TRIAGE
    assert "fw-update failed: exit 3: no image" in f.records["n2"].reason
    progress = mt.node_phase(f.records["n2"], "fw", P.UPDATING, 10)
    assert progress.phase is P.FAILED


def test_a_command_without_an_answer_fails_after_its_timeout_and_grace() -> None:
    f = make_fleet(2)
    record = _in_maintenance(f, "n1")
    assert mt.command_overdue(record, now=20 + 600 + mt.COMMAND_ANSWER_GRACE_S - 1) is None
    late = mt.command_overdue(record, now=20 + 600 + mt.COMMAND_ANSWER_GRACE_S + 1)
    assert late is not None and "no answer from the node's agent" in late.reason
    f.send("n1", late, now=800)
    assert f.state("n1") is S.TRIAGE
    # Nothing is overdue on a node that is not running a command.
    assert mt.command_overdue(f.records["n0"], now=10_000) is None


def test_a_command_plan_needs_a_plain_name() -> None:
    import pytest

    for bad in (None, "../bin/sh", ".hidden", "a/b", ""):
        with pytest.raises(ValueError):
            mt.reason("fw", mt.Action.COMMAND, None, bad)
    assert (
        mt.reason("fw", mt.Action.COMMAND, None, "bios_2.1") == "maintenance plan fw: run bios_2.1"
    )


# ------------------------------------------------------ the Slurm reservation


def test_a_plan_with_a_start_time_reserves_its_unfinished_nodes() -> None:
    nodes = {"n0": P.SUCCEEDED, "n1": P.PENDING, "n2": P.DRAINING, "n3": P.FAILED}
    r = mt.wanted_reservation(
        "fw", start_at=5000.0, reserve=True, phase=mt.PlanPhase.SCHEDULED, nodes=nodes
    )
    assert r == mt.Reservation("gpufleet-maint-fw", 5000.0, frozenset({"n1", "n2"}))
    for phase in (mt.PlanPhase.COMPLETED, mt.PlanPhase.STOPPED, mt.PlanPhase.ABORTED):
        assert (
            mt.wanted_reservation("fw", start_at=5000, reserve=True, phase=phase, nodes=nodes)
            is None
        )
    no_start = mt.wanted_reservation("fw", start_at=None, reserve=True, phase=None, nodes=nodes)
    opted_out = mt.wanted_reservation("fw", start_at=5000, reserve=False, phase=None, nodes=nodes)
    all_done = mt.wanted_reservation(
        "fw", start_at=5000, reserve=True, phase=None, nodes={"n0": P.SUCCEEDED}
    )
    assert no_start is None and opted_out is None and all_done is None


def test_reservation_changes_create_shrink_move_and_delete_only_ours() -> None:
    R = mt.Reservation
    now = 1000.0
    want = [
        R("gpufleet-maint-a", 5000, frozenset({"n1"})),
        R("gpufleet-maint-b", 900, frozenset({"n4"})),
    ]
    have = [
        R("gpufleet-maint-a", 5000, frozenset({"n0", "n1"})),  # n0 finished: shrink
        R("gpufleet-maint-old", 100, frozenset({"n9"})),  # its plan is gone: delete
        R("site-maint", 100, frozenset({"n0"})),  # not ours: never touched
    ]
    changes = mt.reservation_changes(want, have, now=now)
    assert [(c.op, c.reservation.name) for c in changes] == [
        ("update", "gpufleet-maint-a"),
        ("create", "gpufleet-maint-b"),
        ("delete", "gpufleet-maint-old"),
    ]
    assert changes[0].reservation.nodes == {"n1"} and "1 node(s) done" in changes[0].why
    # A start still to come follows the plan; one that has come is never moved.
    moved = mt.reservation_changes(
        [R("gpufleet-maint-a", 6000, frozenset({"n1"}))],
        [R("gpufleet-maint-a", 5000, frozenset({"n1"}))],
        now=now,
    )
    assert [(c.op, c.reservation.start, c.move_start) for c in moved] == [("update", 6000, True)]
    assert "start time changed" in moved[0].why
    # Brought forward into the past: it starts now.
    forward = mt.reservation_changes(
        [R("gpufleet-maint-a", 10, frozenset({"n1"}))],
        [R("gpufleet-maint-a", 5000, frozenset({"n1"}))],
        now=now,
    )
    assert [(c.reservation.start, c.move_start) for c in forward] == [(now, True)]
    started = mt.reservation_changes(
        [R("gpufleet-maint-a", 6000, frozenset({"n1"}))],
        [R("gpufleet-maint-a", 500, frozenset({"n1"}))],
        now=now,
    )
    assert started == []
    assert mt.reservation_changes(want[:1], want[:1], now=now) == []
