"""One bad GPU, not eight: a GPU quarantined alone, on the apiserver, the controller as a
process, the real syncer and real Slurm daemons.

A job runs on GPUs 0-1 of a node; a pending row remap is reported on GPU 3 with
``gpuQuarantine`` on. The controller keeps the node in production (no cordon, no Slurm
drain) and lists GPU 3 in its record with a ``GpuQuarantined`` Event; the syncer holds GPU 3
with a job of its own (``gpufleet-gpu-hold``); the running job goes on; new jobs fill every
other GPU, and none is given GPU 3 (Slurm's allocation and ``CUDA_VISIBLE_DEVICES``), while
one more waits. ``gpufleet policy explain --node`` lists the GPU. Then the repair is due
(``repairAfterSeconds`` set to 0): the node drains letting its jobs finish, the holder is
cancelled, the ladder's GPU reset and the verification (the test plays the agent) run on the
empty node, and verification passed releases the GPU (``GpuReleased``), the node back in
Slurm.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_harness import (
    GV,
    Api,
    answer_request,
    policy_spec,
    prepare_fleet,
    put_policy,
    reset_node,
    running,
    wait_for,
)
from slurm_support import RunningSyncer, Slurm

from gpufleet.domain import conditions, gpu_holds
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

POLICY = "gpu-quarantine"


@pytest.fixture(scope="module")
def env(
    local_cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ClusterInfo, Api, Slurm, Path]]:
    api = Api(local_cluster)
    prepare_fleet(api, local_cluster)
    slurm = Slurm(local_cluster)
    logs = tmp_path_factory.mktemp("gpu-quarantine")
    logs.chmod(0o777)
    settings = SyncSettings(poll_interval_s=0.5, reservation_interval_s=0, gpu_hold_interval_s=0.5)
    syncer = RunningSyncer(local_cluster, settings).start()
    try:
        yield local_cluster, api, slurm, logs
    finally:
        syncer.stop()
        slurm.cancel_all()
        slurm.undrain_all()
        api.delete(f"{GV}/fleetpolicies/{POLICY}")
        for node in local_cluster.node_names:
            reset_node(api, node)


def sbatch(slurm: Slurm, node: str, gpus: int, out: Path) -> str:
    return slurm.run(
        "sbatch", "--parsable", "-w", node, f"--gres=gpu:{gpus}", "-n1", "--mem=1",
        f"--output={out}", "--wrap=echo CVD=$CUDA_VISIBLE_DEVICES; exec sleep 600",
    ).strip().split(";")[0]  # fmt: skip


def job(slurm: Slurm, job_id: str) -> tuple[str, tuple[int, ...]]:
    """(state, GPU indexes) as ``scontrol -d show job`` says."""
    text = slurm.run("scontrol", "-d", "-o", "show", "job", job_id, check=False)
    state = next((t.split("=", 1)[1] for t in text.split() if t.startswith("JobState=")), "GONE")
    return state, gpu_holds.gpu_indexes(text)


def holders(slurm: Slurm) -> list[tuple[str, tuple[int, ...]]]:
    ids = slurm.run("squeue", "-h", "-n", gpu_holds.HOLD_NAME, "-o", "%i").split()
    return [job(slurm, i) for i in ids]


def test_one_bad_gpu_is_held_alone_and_released_after_its_repair(env: Any) -> None:
    info, api, slurm, logs = env
    node = info.node_names[0]
    spec = policy_spec(slurm="auto")
    spec["gpuQuarantine"] = {"enabled": True, "maxGpusPerNode": 1, "repairAfterSeconds": 3600}
    put_policy(api, POLICY, spec)
    with running(info, logs, policy=POLICY):
        wait_for("the node in production", lambda: api.state(node) == "production")
        first = sbatch(slurm, node, 2, logs / "first.out")
        assert wait_for("the first job", lambda: job(slurm, first)[0] == "RUNNING") is True
        assert job(slurm, first)[1] == (0, 1)

        fault = FaultEvent(
            FaultKind.ROW_REMAP_PENDING, node, at=time.time(), evidence=Evidence(gpu_index=3)
        )
        api.set_condition(node, conditions.problem(Subsystem.GPU, [fault]))

        def quarantined() -> list[int] | None:
            record = api.record(node)
            found = [q.index for q in record.quarantined_gpus] if record is not None else []
            return found or None

        assert wait_for("GPU 3 quarantined", quarantined) == [3]
        api.set_condition(node, conditions.healthy(Subsystem.GPU))  # the GPU stays out
        assert api.state(node) == "production"
        assert not api.node(node)["spec"].get("unschedulable")
        said = wait_for(
            "the GpuQuarantined Event",
            lambda: [e["message"] for e in api.events(node) if e["reason"] == "GpuQuarantined"],
        )
        assert "GPU 3 quarantined" in said[0]
        wait_for("GPU 3 held in Slurm", lambda: holders(slurm) == [("RUNNING", (3,))])
        assert job(slurm, first) == ("RUNNING", (0, 1))
        assert slurm.drained(node) is None

        # New work fills every other GPU; none is given GPU 3; one more waits.
        second = sbatch(slurm, node, 3, logs / "second.out")
        third = sbatch(slurm, node, 2, logs / "third.out")
        wait_for(
            "the new jobs running",
            lambda: all(job(slurm, j)[0] == "RUNNING" for j in (second, third)),
        )
        given = [g for j in (first, second, third) for g in job(slurm, j)[1]]
        assert sorted(given) == [0, 1, 2, 4, 5, 6, 7]
        for j in ("second", "third"):
            out = logs / f"{j}.out"
            seen = wait_for(f"{j}'s output", lambda out=out: out.exists() and out.read_text())
            assert "3" not in seen.strip().removeprefix("CVD=").split(","), (j, seen)
        waiting = sbatch(slurm, node, 1, logs / "waiting.out")
        time.sleep(1.5)
        assert job(slurm, waiting)[0] == "PENDING"
        explained = subprocess.run(
            [sys.executable, "-m", "gpufleet.cli.main", "policy", "explain", "--node", node,
             "--xid", "94", "--kubeconfig", str(info.kubeconfig), "--fleet-policy", POLICY],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert explained.returncode == 0, explained.stderr
        assert "GPU 3 (row-remap-pending)" in explained.stdout
        assert "GPU quarantine: its GPU, not the node" in explained.stdout

        # The repair is due: drained letting jobs finish, the holder released, reset on the
        # empty node, verified, the GPU released.
        slurm.run("scancel", waiting)
        api.patch(
            f"{GV}/fleetpolicies/{POLICY}",
            {"spec": {"gpuQuarantine": {"repairAfterSeconds": 0}}},
            kind="merge",
        )
        wait_for("the node draining", lambda: api.state(node) == "draining")
        wait_for("the holder cancelled", lambda: holders(slurm) == [])
        assert wait_for("drained in Slurm", lambda: slurm.drained(node))
        assert job(slurm, first)[0] == "RUNNING"  # let finish: nothing is cut short
        slurm.run("scancel", first, second, third)
        assert answer_request(api, node, passed=True) == "gpu-reset"
        wait_for("verifying", lambda: api.state(node) == "verifying")
        answer_request(api, node, passed=True)
        wait_for("back in production", lambda: api.state(node) == "production")
        record = api.record(node)
        assert record is not None and record.quarantined_gpus == ()
        released = wait_for(
            "the GpuReleased Event",
            lambda: [e["message"] for e in api.events(node) if e["reason"] == "GpuReleased"],
        )
        assert "GPU 3" in released[0]
        wait_for("back in Slurm", lambda: slurm.drained(node) is None)
        assert holders(slurm) == []
