"""A fault under a running 2-node job: requeued, resumed from its checkpoint elsewhere."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_support import Kube, RunningSyncer, Slurm, wait_for

from gpufleet.domain import hostlist, well_known
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "slurm-ddp"
STEPS, EVERY = 30, 5


@pytest.fixture(scope="module")
def env(local_cluster: ClusterInfo) -> Iterator[tuple[Kube, Slurm, RunningSyncer]]:
    kube, slurm = Kube(local_cluster), Slurm(local_cluster)
    for n in local_cluster.node_names:
        kube.reset_node(n)  # start clean, whatever earlier tests left
        kube.set_state(n, "production")
    syncer = RunningSyncer(local_cluster, SyncSettings(poll_interval_s=0.5, hold_taint=False))
    syncer.start()
    try:
        yield kube, slurm, syncer
    finally:
        syncer.stop()
        slurm.cancel_all()
        slurm.undrain_all()
        for n in local_cluster.node_names:
            kube.reset_node(n)


def job(slurm: Slurm, job_id: int) -> dict:
    out = json.loads(slurm.run("squeue", "--json"))
    for j in out["jobs"]:
        if j["job_id"] == job_id:
            return j
    return {}


def events(ckpt: Path) -> list[dict]:
    path = ckpt / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def submit_training(slurm: Slurm, ckpt: Path, steps: int, *extra: str) -> int:
    slurm.env.update(
        CKPT_DIR=str(ckpt),
        PYTHON=sys.executable,
        TRAIN_PY=str(EXAMPLE / "train.py"),
        STEPS=str(steps),
        EVERY=str(EVERY),
        STEP_TIME="0.25",
    )
    out = slurm.run(
        "sbatch",
        "--parsable",
        f"--output={ckpt}/slurm-%j.out",
        *extra,
        str(EXAMPLE / "train.sbatch"),
    )
    return int(out.strip().split(";")[0])


def test_fault_requeues_the_job_which_finishes_from_its_checkpoint(env, tmp_path) -> None:
    kube, slurm, _ = env
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    job_id = submit_training(slurm, ckpt, STEPS)
    wait_for("two checkpoints", lambda: (ckpt / f"step-{2 * EVERY:08d}.json").exists(), 60)
    # Fault between checkpoints, so that some steps must be repeated.
    wait_for(
        "steps past it",
        lambda: any(e.get("step", 0) >= 2 * EVERY + 3 for e in events(ckpt) if e["kind"] == "step"),
        20,
    )
    first_nodes = hostlist.expand(job(slurm, job_id)["nodes"])
    assert len(first_nodes) == 2
    faulty = first_nodes[1]
    fault_at = time.time()
    kube.set_condition(faulty, "GpuProblem", "True", "Xid79")
    wait_for("our drain", lambda: slurm.drained(faulty) == "gpufleet: GpuProblem Xid79", 5)
    done = wait_for(
        "job completes",
        lambda: [e for e in events(ckpt) if e["kind"] == "done"],
        90,
        step=0.5,
    )
    wait_for("COMPLETED", lambda: job(slurm, job_id).get("job_state") == "COMPLETED", 20)
    log = events(ckpt)
    starts = [e for e in log if e["kind"] == "start"]
    assert len(starts) == 2, starts
    # torch is in the test environment (docs/decisions/0030): the DDP path is the one tested.
    assert {s["backend"] for s in starts} == {"torch"}, starts
    resumed_at = starts[1]["step"]
    assert resumed_at >= 2 * EVERY and resumed_at % EVERY == 0
    steps_run = [e["step"] for e in log if e["kind"] == "step"]
    before_fault = [e["step"] for e in log if e["kind"] == "step" and e["t"] < fault_at]
    lost = len(steps_run) - STEPS
    assert 0 <= lost <= EVERY, f"repeated {lost} steps (checkpoint every {EVERY})"
    assert max(before_fault) - resumed_at <= EVERY
    assert sorted(set(steps_run)) == list(range(1, STEPS + 1))
    assert done[-1]["step"] == STEPS
    second_nodes = hostlist.expand(job(slurm, job_id)["nodes"])
    assert faulty not in second_nodes
    print(
        f"\nresumed at step {resumed_at}; {lost} steps repeated; nodes {first_nodes} -> "
        f"{second_nodes}"
    )
    kube.set_condition(faulty, "GpuProblem", "False", "Healthy")
    wait_for("resume", lambda: slurm.drained(faulty) is None, 5)


def test_a_job_that_cannot_be_requeued_is_reported_not_killed(env, local_cluster) -> None:
    kube, slurm, syncer = env
    node = local_cluster.node_names[3]
    out = slurm.run(
        "sbatch",
        "--parsable",
        "--no-requeue",
        f"--nodelist={node}",
        "--output=/dev/null",
        "--wrap=sleep 60",
    )
    job_id = int(out.strip().split(";")[0])
    wait_for("running", lambda: job(slurm, job_id).get("job_state") == "RUNNING", 20)
    kube.set_condition(node, "GpuProblem", "True", "Xid79")
    wait_for(
        "reported",
        lambda: kube.annotation(node, well_known.ANNOTATION_SLURM_STUCK_JOBS) == str(job_id),
        10,
    )
    syncer.passed(kube, node)  # passes over the drained node since: still not requeued
    assert job(slurm, job_id).get("job_state") == "RUNNING"
    slurm.run("scancel", str(job_id))
    kube.set_condition(node, "GpuProblem", "False", "Healthy")
    wait_for("resume", lambda: slurm.drained(node) is None, 10)
    wait_for(
        "report cleared",
        lambda: kube.annotation(node, well_known.ANNOTATION_SLURM_STUCK_JOBS) is None,
        10,
    )
