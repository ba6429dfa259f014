"""A MaintenancePlan's window in Slurm: the syncer keeps a maintenance reservation
(``gpufleet-maint-<plan>``) on the plan's unfinished nodes from its start time.

Real apiserver, the real lifecycle controller process, real Slurm daemons and the real
syncer; the test plays the node agent (answers verification requests). Before the window,
a job whose time limit would cross it waits while a short one runs; the window brought
forward starts the plan (one node at a time), each finished node leaves the reservation,
the last one deletes it, and the waiting job runs. A reservation gpufleet did not make
is never touched.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    answer_request,
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

from gpufleet.domain import hostlist
from gpufleet.domain.enrollment import rfc3339
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

SELECT = "example.com/window"
PLAN = "window"
OURS = f"gpufleet-maint-{PLAN}"
FOREIGN = "site-hold"


@pytest.fixture(scope="module")
def env(
    local_cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ClusterInfo, Api, Slurm, Path]]:
    api = Api(local_cluster)
    prepare_fleet(api, local_cluster)
    for node in local_cluster.node_names[:2]:
        api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {SELECT: "yes"}}})
    slurm = Slurm(local_cluster)
    logs = tmp_path_factory.mktemp("maintenance-reservation")
    settings = SyncSettings(poll_interval_s=0.5, reservation_interval_s=1.0)
    syncer = RunningSyncer(local_cluster, settings).start()
    try:
        yield local_cluster, api, slurm, logs
    finally:
        syncer.stop()
        slurm.cancel_all()
        for name in (OURS, FOREIGN):
            slurm.run("scontrol", "delete", f"ReservationName={name}", check=False)
        slurm.undrain_all()
        api.delete(f"{GV}/maintenanceplans/{PLAN}")
        for node in local_cluster.node_names:
            reset_node(api, node)
            api.patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {SELECT: None}}})


def reservations(slurm: Slurm) -> dict[str, dict[str, str]]:
    """``scontrol -o show reservation`` as {name: fields}."""
    out = slurm.run("scontrol", "-o", "show", "reservation")
    found = {}
    for line in out.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        if "ReservationName" in fields:
            found[fields["ReservationName"]] = fields
    return found


def job_state(slurm: Slurm, job: str) -> str:
    return slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).strip() or "GONE"


def sbatch(slurm: Slurm, node: str, minutes: int) -> str:
    out = slurm.run(
        "sbatch", "--parsable", "--output=/dev/null", f"--time={minutes}", "-w", node,
        "--wrap=sleep 2",
    )  # fmt: skip
    return out.strip().split(";")[0]


def test_the_window_is_a_slurm_reservation_that_shrinks_and_goes(env: Any) -> None:
    info, api, slurm, logs = env
    nodes = list(info.node_names[:2])
    other = info.node_names[3]
    slurm.run(
        "scontrol", "create", "reservation", f"ReservationName={FOREIGN}", "StartTime=now+4hours",
        "Duration=60", f"Nodes={other}", "Users=root",
    )  # fmt: skip
    spec = policy_spec(slurm="auto")
    spec["safety"]["budget"] = {"maxNodes": 2, "maxPercent": 100, "minNodes": 2}
    put_policy(api, "window", spec)
    start = time.time() + 3600
    with running(info, logs, policy="window"):
        wait_for("nodes in production", lambda: all(api.state(n) == "production" for n in nodes))
        maintenance_cli(
            info, "create", PLAN, "--action", "noop", "-l", f"{SELECT}=yes",
            "--max-unavailable", "1", "--start-at", rfc3339(start),
        )  # fmt: skip
        wait_for("the reservation", lambda: OURS in reservations(slurm), timeout=30)
        res = reservations(slurm)[OURS]
        assert set(hostlist.expand(res["Nodes"])) == set(nodes)
        assert "MAINT" in res["Flags"] and "IGNORE_JOBS" in res["Flags"]
        assert abs(time.mktime(time.strptime(res["StartTime"], "%Y-%m-%dT%H:%M:%S")) - start) < 2
        # Before the window: a 2-hour job waits, a 5-minute one runs and ends.
        long_job = sbatch(slurm, nodes[0], 120)
        short_job = sbatch(slurm, nodes[0], 5)
        wait_for("the short job ran", lambda: job_state(slurm, short_job) == "GONE", timeout=60)
        assert job_state(slurm, long_job) == "PENDING"
        reason = slurm.run("squeue", "-h", "-j", long_job, "-o", "%r").strip()
        assert "ReqNodeNotAvail" in reason or "Resources" in reason or "Reserv" in reason, reason
        assert plan_status(api, PLAN)["phase"] == "Scheduled"

        # The window brought forward: the reservation starts now and the plan runs.
        api.patch(
            f"{GV}/maintenanceplans/{PLAN}",
            {"spec": {"startAt": rfc3339(time.time() - 1)}},
            kind="merge",
        )

        def started_now() -> bool:
            fields = reservations(slurm).get(OURS)
            if fields is None:
                return False
            at = time.mktime(time.strptime(fields["StartTime"], "%Y-%m-%dT%H:%M:%S"))
            return at <= time.time() + 1

        wait_for("the reservation moved to now", started_now, timeout=30)
        answered: set[str] = set()
        sizes: set[int] = set()

        def completed() -> bool:
            fields = reservations(slurm).get(OURS)
            if fields is not None:
                sizes.add(len(hostlist.expand(fields["Nodes"])))
            for n in nodes:
                # The second node (its batch comes after the first's) is verified only once
                # the reservation was seen without the first: a shrink, not a guess.
                if n == nodes[1] and 1 not in sizes:
                    continue
                if api.state(n) == "verifying":
                    rid = (api.node(n)["metadata"].get("annotations") or {}).get(
                        "gpufleet.io/agent-request", ""
                    )
                    if rid and rid not in answered:
                        answered.add(rid)
                        answer_request(api, n, passed=True)
            return plan_status(api, PLAN).get("phase") == "Completed"

        wait_for("plan completed", completed, timeout=120)
        wait_for("our reservation deleted", lambda: OURS not in reservations(slurm), timeout=30)
        assert {1, 2} <= sizes, sizes  # the first node done left it, then the last deleted it
        # The foreign reservation is as it was; the waiting job runs once the window closed.
        assert set(hostlist.expand(reservations(slurm)[FOREIGN]["Nodes"])) == {other}
        wait_for("the long job ran", lambda: job_state(slurm, long_job) == "GONE", timeout=60)
