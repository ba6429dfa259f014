"""Rolling maintenance on the local cluster: a MaintenancePlan reimages 4 nodes in batches
bounded by the disruption budget and by rack, waits for a running Slurm job before it touches
that job's node, verifies each node before the next batch, and records the image version; a
second plan stops itself after its first failed verification. Real apiserver, real Slurm
daemons and syncer, Redfish BMCs; the test plays the node agent (it answers the verification
requests), as the controller tests do, and drives the plan with ``gpufleet maintenance``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    WELL_BEHAVED_BMC,
    Api,
    answer_request,
    bmc_control,
    bmc_counters,
    maintenance_cli,
    plan_status,
    policy_spec,
    prepare_fleet,
    put_policy,
    reset_node,
    running,
    wait_for,
)
from slurm_support import RunningSyncer, Slurm

from gpufleet.domain import conditions, well_known
from gpufleet.domain.states import NodeState, Trigger
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

RACK = "example.com/rack"
SELECT = "example.com/maintain"
RACKS = ("r1", "r1", "r2", "r3")
"""Racks of the four nodes: two share r1."""


@pytest.fixture(scope="module")
def env(
    local_cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ClusterInfo, Api, Slurm, Path]]:
    api = Api(local_cluster)
    prepare_fleet(api, local_cluster)
    for node, rack in zip(local_cluster.node_names, RACKS, strict=False):
        api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {RACK: rack, SELECT: "yes"}}})
        bmc_control(local_cluster, node, **WELL_BEHAVED_BMC)
    slurm = Slurm(local_cluster)
    logs = tmp_path_factory.mktemp("maintenance")
    syncer = RunningSyncer(local_cluster, SyncSettings(poll_interval_s=0.5)).start()
    try:
        yield local_cluster, api, slurm, logs
    finally:
        syncer.stop()
        slurm.cancel_all()
        slurm.undrain_all()
        for plan in ("rollout", "stops"):
            api.delete(f"{GV}/maintenanceplans/{plan}")
        for node in local_cluster.node_names:
            reset_node(api, node)
            api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {RACK: None, SELECT: None}}})


def resets(info: ClusterInfo, node: str) -> int:
    return int(bmc_counters(info, node)["ResetCount"])


def job_state(slurm: Slurm, job_id: str) -> str:
    out = slurm.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
    return out.strip() or "GONE"


def out_interval(api: Api, node: str, plan: str) -> tuple[float, float]:
    """When the plan took the node out and when it returned, from the node's history."""
    record = api.record(node)
    assert record is not None
    starts = [
        t.at
        for t in record.history
        if t.trigger is Trigger.MAINTENANCE_REQUESTED and f"plan {plan}:" in t.reason
    ]
    assert len(starts) == 1, record.history
    back = [t.at for t in record.history if t.target is NodeState.PRODUCTION and t.at > starts[0]]
    assert back, record.history
    return starts[0], back[0]


def verify_when_asked(api: Api, nodes: list[str], fail: set[str], answered: set[str]) -> None:
    """Play the agent: answer each node's verification request once (fail those in ``fail``)."""
    for node in nodes:
        if api.state(node) != "verifying":
            continue
        ann = api.node(node)["metadata"].get("annotations") or {}
        request = conditions.decode_request(ann.get(well_known.ANNOTATION_AGENT_REQUEST))
        if request is None or request.id in answered:
            continue
        answered.add(request.id)
        answer_request(api, node, passed=node not in fail, detail="gemm 20% below baseline")


def test_a_reimage_rollout_respects_budget_and_racks_and_waits_for_the_slurm_job(
    env: Any,
) -> None:
    info, api, slurm, logs = env
    nodes = list(info.node_names[:4])
    spec = policy_spec(slurm="auto")
    spec["safety"]["budget"] = {"maxNodes": 2, "maxPercent": 100, "minNodes": 2}
    put_policy(api, "maintenance", spec)
    before = {n: resets(info, n) for n in nodes}
    job = slurm.run("sbatch", "--parsable", "--output=/dev/null", "-w", nodes[0], "--wrap=sleep 15")
    job_id = job.strip().split(";")[0]
    wait_for("job running", lambda: job_state(slurm, job_id) == "RUNNING", timeout=30)
    with running(info, logs, policy="maintenance"):
        maintenance_cli(
            info,
            "create",
            "rollout",
            "--action",
            "reimage",
            "--image",
            "2024.06.1",
            "-l",
            f"{SELECT}=yes",
            "--failure-domain-label",
            RACK,
            "--max-unavailable",
            "4",
        )
        answered: set[str] = set()
        max_out = 0
        saw_slurm_drain = False
        while True:
            # Observe first, then ask Slurm: what was seen before a RUNNING answer was seen
            # while the job ran (a let-finish job is not requeued).
            verify_when_asked(api, nodes, set(), answered)
            states = {n: api.state(n) for n in nodes}
            n0_resets = resets(info, nodes[0])
            drained = (slurm.drained(nodes[0]) or "").startswith("gpufleet:")
            max_out = max(max_out, sum(1 for s in states.values() if s != "production"))
            if job_state(slurm, job_id) != "RUNNING":
                break
            # The job's node is drained in Slurm but never reset while the job runs.
            assert n0_resets == before[nodes[0]], "reimaged under a running job"
            assert states[nodes[0]] in ("draining", "production"), states
            # Strict batches: the other rack-r1 node and r3's wait while n0's batch is out.
            if states[nodes[0]] == "draining":
                assert states[nodes[1]] == "production" and states[nodes[3]] == "production"
                saw_slurm_drain = saw_slurm_drain or drained
            time.sleep(0.3)
        assert saw_slurm_drain, "the job's node was not drained in Slurm while the job ran"

        def finished() -> bool:
            verify_when_asked(api, nodes, set(), answered)
            return plan_status(api, "rollout").get("phase") == "Completed"

        wait_for("plan completed", finished, timeout=90)
        shown = json.loads(maintenance_cli(info, "show", "rollout", "-o", "json"))
    st = plan_status(api, "rollout")
    assert (st["total"], st["succeeded"], st["failed"], st["progress"]) == (4, 4, 0, "4/4")
    assert shown["phase"] == "Completed" and shown["succeeded"] == 4
    assert {n["name"]: n["phase"] for n in st["nodes"]} == dict.fromkeys(nodes, "Succeeded")
    for node in nodes:
        assert api.state(node) == "production"
        ann = api.node(node)["metadata"].get("annotations") or {}
        assert ann.get(well_known.ANNOTATION_IMAGE_VERSION) == "2024.06.1"
        assert resets(info, node) > before[node], f"{node} was not reimaged"
        assert not api.node(node)["spec"].get("unschedulable"), f"{node} left cordoned"
    # Batches, from the nodes' own histories: never more than the budget (2) out at once,
    # never two of rack r1 together, and the second batch only after the first returned.
    spans = {n: out_interval(api, n, "rollout") for n in nodes}
    for t in sorted(s for s, _ in spans.values()):
        out = [n for n, (s, e) in spans.items() if s <= t < e]
        assert len(out) <= 2, spans
        assert sum(1 for n in out if RACKS[nodes.index(n)] == "r1") <= 1, spans
    # Batch 1 is n0 (r1) and n2 (r2): n1 shares n0's rack and the budget stops at two.
    last_back_of_first = max(spans[n][1] for n in (nodes[0], nodes[2]))
    assert spans[nodes[1]][0] >= last_back_of_first and spans[nodes[3]][0] >= last_back_of_first
    assert max_out <= 2
    assert job_state(slurm, job_id) == "GONE"


def test_a_plan_pauses_resumes_and_stops_itself_after_max_failures(env: Any) -> None:
    info, api, _, logs = env
    nodes = list(info.node_names[:4])
    spec = policy_spec(slurm="auto")
    spec["safety"]["budget"] = {"maxNodes": 1, "maxPercent": 100, "minNodes": 1}
    put_policy(api, "maintenance-stop", spec)
    with running(info, logs, policy="maintenance-stop") as ctl:
        wait_for("nodes in production", lambda: all(api.state(n) == "production" for n in nodes))
        maintenance_cli(
            info, "create", "stops", "--action", "noop", "-l", f"{SELECT}=yes", "--paused"
        )
        ctl.wait_ticks(3)
        st = plan_status(api, "stops")
        assert st.get("phase") == "Paused" and st.get("pending") == 4, st
        assert all(api.state(n) == "production" for n in nodes)
        maintenance_cli(info, "resume", "stops")
        # The first node (by name) goes out alone (budget 1), is held in maintenance, then
        # verified: its verification fails and the plan stops.
        answered: set[str] = set()

        def stopped() -> bool:
            verify_when_asked(api, nodes, {nodes[0]}, answered)
            return plan_status(api, "stops").get("phase") == "Stopped"

        wait_for("plan stopped", stopped, timeout=60)
        ctl.wait_ticks(3)
        st = plan_status(api, "stops")
    assert (st["failed"], st["succeeded"], st["pending"]) == (1, 0, 3), st
    by_node = {n["name"]: n for n in st["nodes"]}
    assert by_node[nodes[0]]["phase"] == "Failed"
    assert "verification failed" in by_node[nodes[0]]["message"]
    stopped_cond = next(c for c in st["conditions"] if c["type"] == "Stopped")
    assert stopped_cond["status"] == "True"
    for node in nodes[1:]:
        assert api.state(node) == "production", f"{node} started after the plan stopped"
    # The failed node is the ladder's now (repair under its record's reason), not left
    # cordoned without one.
    record = api.record(nodes[0])
    assert record is not None and record.state is not NodeState.PRODUCTION
    assert record.incident is not None and record.incident.key == "maintenance:stops"
