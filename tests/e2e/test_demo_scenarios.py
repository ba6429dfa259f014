"""Every ``gpufleet demo`` scenario, end to end, with assertions on its timeline."""

from __future__ import annotations

import pytest

from gpufleet.demo.job import JobShape
from gpufleet.demo.runner import Demo, ScenarioResult
from gpufleet.domain import hostlist

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

SHAPE = JobShape()


def kinds(r: ScenarioResult, kind: str, node: str | None = None) -> list[str]:
    return [e.text for e in r.entries if e.kind == kind and (node is None or e.node == node)]


def order(r: ScenarioResult, *steps: tuple[str, str | None]) -> None:
    """Each (kind, node) happened, in this order: none was certainly over before the step
    that precedes it could have begun (the observer reads each source at its own moment:
    ``Entry.earliest`` and ``Entry.latest`` bound when a thing happened)."""
    last = 0.0
    for kind, node in steps:
        seen = [e for e in r.entries if e.kind == kind and (node is None or e.node == node)]
        assert seen, f"{kind} on {node} never happened"
        after = [e for e in seen if e.latest >= last]
        assert after, f"{kind} on {node} before the step that precedes it: {seen[-1]}"
        last = min(e.earliest for e in after)


def job_completed_with_bounded_loss(r: ScenarioResult) -> None:
    work = r.figures["work"]
    assert work is not None, "the job did not finish"
    assert work.steps == SHAPE.steps
    assert work.restarts >= 1 and work.resumed_at is not None and work.resumed_at > 0
    assert work.resumed_at % SHAPE.every == 0
    assert 0 <= work.repeated <= SHAPE.every, f"{work.repeated} steps repeated"
    assert kinds(r, "job-completed")


def test_xid79_job_resumes_from_its_checkpoint_and_the_node_returns(demo: Demo) -> None:
    r = demo.run("xid79")
    node = r.figures["faulty"]
    order(
        r,
        ("fault", node),
        ("condition", node),
        ("cordon", node),
        ("slurm-drain", node),
        ("bmc-reset", node),
        ("agent-result", node),
        ("uncordon", node),
        ("slurm-resume", node),
        ("train-done", None),
    )
    assert kinds(r, "job-requeued")
    assert len(kinds(r, "bmc-reset", node)) == 1
    job_completed_with_bounded_loss(r)
    assert r.figures["detect_s"] < 5 and r.figures["isolate_s"] < 5
    assert r.seconds < 180


def test_ecc_uncorrectable_is_repaired_by_a_gpu_reset_without_a_reboot(demo: Demo) -> None:
    r = demo.run("ecc-uncorrectable")
    node = r.figures["faulty"]
    order(r, ("fault", node), ("condition", node), ("cordon", node), ("uncordon", node))
    assert any("gpu-reset: passed" in t for t in kinds(r, "agent-result", node))
    assert not kinds(r, "bmc-reset")
    job_completed_with_bounded_loss(r)


def test_controller_killed_mid_remediation_resumes_with_exactly_one_power_cycle(
    demo: Demo,
) -> None:
    r = demo.run("controller-crash-mid-remediation")
    node = r.figures["faulty"]
    resets = kinds(r, "bmc-reset", node)
    assert len(resets) == 1 and "PowerCycle" in resets[0]
    assert r.figures["power_cycles"] == 1
    assert any("SIGKILL" in e.text for e in r.entries if e.kind == "demo")
    order(r, ("bmc-reset", node), ("demo", None), ("uncordon", node), ("slurm-resume", node))
    job_completed_with_bounded_loss(r)


def test_fault_storm_is_held_by_the_budget_and_the_breaker(demo: Demo) -> None:
    r = demo.run("fault-storm")
    assert r.figures["breaker_open"] is True
    assert len(r.figures["out"]) <= r.figures["budget"] == 1
    assert kinds(r, "breaker-open")
    assert len(kinds(r, "cordon")) <= 1
    # The rails hold in Slurm too: the syncer follows the controller's decision.
    drained = {e.node for e in r.entries if e.kind == "slurm-drain"}
    assert len(drained) <= 1, kinds(r, "slurm-drain")
    # The faults the rails held are kept as pending incidents, not dropped.
    out = set(r.figures["out"])
    assert r.figures["held"] and not out & set(r.figures["held"])


def test_inference_pod_takes_a_node_from_slurm_and_the_job_completes(demo: Demo) -> None:
    r = demo.run("preemption-by-inference-pod")
    lent = r.figures["lent"]
    order(
        r,
        ("lent", lent),
        ("slurm-drain", lent),
        ("pod-running", lent),
        ("returned", lent),
        ("slurm-resume", lent),
        ("train-done", None),
    )
    assert kinds(r, "job-requeued")
    assert r.figures["pod_running_s"] < 30
    job_completed_with_bounded_loss(r)


def test_an_sbatch_job_and_a_kubernetes_gang_share_one_queue_by_priority(demo: Demo) -> None:
    r = demo.run("shared-queue")
    f = r.figures
    gang, sbatch = f["gang"], f["sbatch"]
    # The gang's job came first, the sbatch job has the higher priority: Slurm ran it first
    # while every pod of the gang stayed Pending, then gave the gang its nodes.
    assert f["gang_job"] < f["sbatch_job"]
    assert sbatch.priority > gang.priority
    assert f["gang_waited"] is True
    assert sbatch.end != "Unknown" and gang.start >= sbatch.end, (sbatch, gang)
    done = next(e for e in r.entries if e.kind == "train-done")
    placed = [
        e
        for e in r.entries
        if e.kind in ("pod", "pod-running") and e.node and str(e.data["pod"]).startswith("gang-")
    ]
    assert placed and all(e.latest >= done.earliest for e in placed), placed
    # All at once, one pod per node of the one Slurm job.
    nodes = demo.fleet.info.node_names
    assert len(f["gang_nodes"]) == len(nodes)
    # squeue's node list of a COMPLETING job holds only the nodes not yet returned to
    # service (squeue(1), %N), so a job read while it ends names a part of its nodes.
    listed = sorted(hostlist.expand(gang.nodes)) if gang.nodes else []
    if gang.state == "COMPLETING":
        assert set(listed) <= set(f["gang_nodes"]), (gang, f["gang_nodes"])
    else:
        assert not listed or listed == f["gang_nodes"], (gang, f["gang_nodes"])
    work = f["work"]
    assert work is not None and work.steps == SHAPE.steps and work.restarts == 0


def test_a_slurm_health_check_drain_is_repaired_and_an_admin_drain_is_left_alone(
    demo: Demo,
) -> None:
    r = demo.run("slurm-health-drain")
    node, held = r.figures["faulty"], r.figures["held"]
    order(
        r,
        ("slurm-drain", held),
        ("fault", node),
        ("slurm-drain", node),
        ("condition", node),
        ("cordon", node),
        ("bmc-reset", node),
        ("agent-result", node),
        ("uncordon", node),
        ("slurm-resume", node),
    )
    drains = kinds(r, "slurm-drain", node)
    assert "NHC:" in drains[0] and any("gpufleet:" in d for d in drains[1:]), drains
    assert len(kinds(r, "bmc-reset", node)) == 1
    # the administrator's drain: still there when the repair was over, never taken over,
    # the node never cordoned; only the administrator's own resume ends it
    assert r.figures["held_reason"] == "maintenance by alice: reseat the PSU"
    assert len(kinds(r, "slurm-drain", held)) == 1
    assert not kinds(r, "cordon", held) and not kinds(r, "bmc-reset", held)
    order(r, ("slurm-resume", node), ("demo", held), ("slurm-resume", held))
    assert len(kinds(r, "slurm-resume", held)) == 1


def test_ib_flaps_take_the_node_out_on_the_third(demo: Demo) -> None:
    r = demo.run("ib-flap")
    node = r.figures["faulty"]
    assert len(kinds(r, "condition", node)) == 1
    job_completed_with_bounded_loss(r)


def test_a_straggler_is_found_in_the_job_telemetry_and_the_job_regains_its_pace(
    demo: Demo,
) -> None:
    r = demo.run("straggler")
    node, peer = r.figures["faulty"], r.figures["peer"]
    order(
        r,
        ("fault", node),
        ("event", node),
        ("condition", node),
        ("cordon", node),
        ("slurm-drain", node),
        ("bmc-reset", node),
        ("uncordon", node),
        ("slurm-resume", node),
        ("train-done", None),
    )
    condition = min(e.t for e in r.entries if e.kind == "condition" and e.node == node)
    logged = [
        e.text
        for e in r.entries
        if e.kind == "event" and e.node == node and e.t <= condition and "Straggler" in e.text
    ]
    assert sum("(policy: log)" in t for t in logged) == 2, logged  # the 3rd takes it out
    assert not [t for t in kinds(r, "event", peer) if "Straggler" in t]
    job_completed_with_bounded_loss(r)
    work = r.figures["work"]
    assert r.figures["slow_step_s"] > 1.8 * work.step_s  # the job really ran at its pace
    assert r.figures["pace_after_s"] < 1.3 * work.step_s  # and regained its own after


def test_sdc_is_found_by_the_idle_time_check_and_the_node_goes_to_triage(demo: Demo) -> None:
    r = demo.run("sdc-found-by-active-check")
    node = r.figures["faulty"]
    order(r, ("condition", node), ("cordon", node), ("slurm-drain", node), ("state", node))
    assert any("triage" in t for t in kinds(r, "state", node))
    # The job ran on other nodes: it finishes untouched.
    work = r.figures["work"]
    assert work is not None and work.steps == SHAPE.steps
    assert work.restarts == 0 and work.repeated == 0
    assert kinds(r, "job-completed")


def test_new_machine_boots_joins_passes_burn_in_and_reaches_production(demo: Demo) -> None:
    r = demo.run("new-machine")
    node = r.figures["joined"]
    order(
        r,
        ("power-on", node),
        ("ipxe", node),
        ("user-data", node),
        ("token-accepted", node),
        ("node-added", node),
        ("node-ready", node),
        ("state", node),
        ("agent-result", node),
        ("state", node),
        ("token-refused", node),
    )
    states = [e.data["state"] for e in r.entries if e.kind == "state" and e.node == node]
    assert states == ["burn-in", "production"], states
    added = next(e for e in r.entries if e.kind == "node-added" and e.node == node)
    assert added.data == {"state": "provisioning", "machine": node}
    assert any("system:bootstrap:" in t for t in kinds(r, "token-accepted", node))
    assert any("checks burn-in: passed" in t for t in kinds(r, "agent-result", node))
    assert r.figures["machine_phase"] == "Joined"
    assert r.figures["node_s"] < r.figures["burn_in_s"] < r.figures["production_s"]


def test_a_maintenance_plan_rolls_over_the_fleet_in_batches_around_a_slurm_job(
    demo: Demo,
) -> None:
    r = demo.run("maintenance")
    nodes = demo.fleet.info.node_names
    status = r.figures["plan"]
    assert status["phase"] == "Completed" and status["failed"] == 0
    assert status["succeeded"] == status["total"] == len(nodes)
    for node in nodes:
        assert len(kinds(r, "bmc-reset", node)) == 1, node
    # The job's node: drained in Slurm while the job ran, rebooted only after it ended.
    order(r, ("slurm-drain", nodes[0]), ("job-completed", None), ("bmc-reset", nodes[0]))
    # Batches: the first is nodes 0 and 2 (node 1 shares node 0's leaf; the budget is 2);
    # the second starts only once both are back in production.
    first = {e.node: e.t for e in r.entries if e.kind == "bmc-reset"}
    back = max(
        e.t
        for e in r.entries
        if e.kind == "state" and e.node in (nodes[0], nodes[2]) and "-> production" in e.text
    )
    assert first[nodes[1]] > back and first[nodes[3]] > back
    assert first[nodes[2]] < first[nodes[0]]


def test_replica_groups_train_on_while_one_group_is_replaced_from_a_peer(demo: Demo) -> None:
    r = demo.run("replica-groups")
    f = r.figures
    node = f["faulty"]
    order(
        r,
        ("fault", node),
        ("condition", node),
        ("cordon", node),
        ("slurm-drain", node),
        ("job-requeued", None),
        ("slurm-resume", node),
    )
    # The group left at a step boundary; the two others lost no step while it was replaced.
    assert f["departed_at_step_boundary"]
    assert f["survivors_steps_lost"] == 0
    # The requeued group ran elsewhere and copied the weights from a live peer.
    assert f["replacement_node"] != node
    assert f["recovered_from"] in {"peer g0", "peer g2"}
