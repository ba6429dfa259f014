"""Hot spares on the local cluster: a repaired node waits as a spare (label, taint, Slurm drain
``gpufleet: spare``) and is promoted when a fault takes another node out: label and taint gone
and the node resumed in Slurm, where it takes a job. Real apiserver, real Slurm daemons and
syncer, Redfish BMCs; the test plays the node agent, as the controller tests do."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    Api,
    answer_request,
    policy_spec,
    put_policy,
    report_fault,
    running,
    wait_for,
)
from fleet import Fleet
from slurm_support import RunningSyncer, Slurm

from gpufleet.domain import conditions, well_known
from gpufleet.domain.faults import Subsystem
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(fleet: Fleet) -> Iterator[tuple[ClusterInfo, Api, Slurm, Path]]:
    api = fleet.api
    slurm = Slurm(fleet.info)
    syncer = RunningSyncer(fleet.info, SyncSettings(poll_interval_s=0.5)).start()
    try:
        yield fleet.info, api, slurm, fleet.logs
    finally:
        syncer.stop()
        slurm.cancel_all()
        slurm.undrain_all()
        for node in fleet.info.node_names:
            api.patch(
                f"/api/v1/nodes/{node}", {"metadata": {"labels": {well_known.LABEL_SPARE: None}}}
            )


def _labels(api: Api, node: str) -> dict[str, str]:
    return api.node(node)["metadata"].get("labels") or {}


def _taints(api: Api, node: str) -> set[str]:
    return {t["key"] for t in api.node(node).get("spec", {}).get("taints") or []}


def _repair(api: Api, node: str) -> None:
    """Fault, reboot through the BMC, verification passed: back in production."""
    report_fault(api, node, 79)
    wait_for(f"{node} verifying", lambda: api.state(node) == "verifying", timeout=90)
    api.set_condition(node, conditions.healthy(Subsystem.PCIE))
    answer_request(api, node, passed=True)
    wait_for(f"{node} in production", lambda: api.state(node) == "production", timeout=30)


def test_a_repaired_node_waits_as_a_spare_and_is_promoted_when_a_fault_takes_another(
    env: Any,
) -> None:
    info, api, slurm, logs = env
    spare, other = info.node_names[0], info.node_names[1]
    spares = {"percent": 0, "minNodes": 1, "maxNodes": 1}
    put_policy(api, "spares", policy_spec(slurm="auto", spares=spares))
    with running(info, logs, policy="spares"):
        _repair(api, spare)
        record = api.record(spare)
        assert record is not None and record.is_spare
        assert _labels(api, spare).get(well_known.LABEL_SPARE) == "true"
        assert well_known.TAINT_SPARE in _taints(api, spare)
        wait_for("spare drained in Slurm", lambda: slurm.drained(spare) == "gpufleet: spare", 20)

        report_fault(api, other, 79)
        wait_for(f"{other} out", lambda: api.state(other) != "production", timeout=15)
        wait_for(
            "spare promoted",
            lambda: well_known.LABEL_SPARE not in _labels(api, spare),
            timeout=15,
        )
        assert well_known.TAINT_SPARE not in _taints(api, spare)
        wait_for("spare resumed in Slurm", lambda: slurm.drained(spare) is None, timeout=20)
        wait_for(
            "SparePromoted Event",  # posted after the write that promoted it
            lambda: any(e.get("reason") == "SparePromoted" for e in api.events(spare)),
            timeout=15,
        )
        job = slurm.run(
            "sbatch", "--parsable", "--output=/dev/null", "-w", spare, "--wrap=sleep 5"
        ).strip()
        job_id = job.split(";")[0]
        wait_for(
            "job running on the promoted node",
            lambda: (
                slurm.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False).strip()
                == "RUNNING"
            ),
            timeout=30,
        )

        # The repaired node refills the pool: it waits as the spare now.
        api.set_condition(other, conditions.healthy(Subsystem.PCIE))
        wait_for(f"{other} verifying", lambda: api.state(other) == "verifying", timeout=90)
        answer_request(api, other, passed=True)
        wait_for(
            f"{other} is the spare",
            lambda: _labels(api, other).get(well_known.LABEL_SPARE) == "true",
            timeout=30,
        )
        assert api.state(other) == "production"
        wait_for("new spare drained", lambda: slurm.drained(other) == "gpufleet: spare", 20)
