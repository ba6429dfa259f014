"""Slurm's own health checks in the repair loop, on the local cluster's real Slurm:
``gpufleet health check`` as Prolog and Epilog (a failed check drains the node and the
job runs elsewhere; a hung check is cut at its bound and the job runs), the syncer
turning that drain into fault ``slurm-drain`` and taking it over once the node is out,
and the gang preflight that requeues a multi-node job without the node that did not
answer. The hooks are turned on for this module only and slurm.conf is restored."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_support import Kube, RunningSyncer, Slurm
from waiting import wait_for

from gpufleet.domain import conditions, slurm_hooks, well_known
from gpufleet.domain.faults import FaultKind
from gpufleet.domain.records import NodeRecord, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.local import slurm as local_slurm
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))
HEALTH = "SlurmHealthProblem"
OWNED_DRAINING = "gpufleet: state draining"


@pytest.fixture(scope="module")
def hooks(
    local_cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Kube, Slurm, RunningSyncer, Path]]:
    """Prolog and Epilog on (simulated backend, per-node injections), and a syncer."""
    kube, slurm = Kube(local_cluster), Slurm(local_cluster)
    hook_dir = tmp_path_factory.mktemp("hooks")
    cfg = slurm_hooks.HookConfig(
        gpufleet=GPUFLEET,
        checks=("gpu-count", "gpu-xid"),
        timeout_s=8,
        preflight=True,
        preflight_timeout_s=30,
        extra_args=("--backend", "simulated"),
        inject_dir=str(hook_dir),
        log_file=str(hook_dir / "log"),
    )
    conf = Path(local_cluster.slurm_conf or "")
    before = local_slurm.enable_health_hooks(conf, hook_dir, cfg)
    for n in local_cluster.node_names:
        kube.reset_node(n)
        kube.set_state(n, "production")
    syncer = RunningSyncer(local_cluster, SyncSettings(poll_interval_s=0.5, hold_taint=False))
    try:
        slurm.run("scontrol", "reconfigure")
        wait_for(
            "slurmctld to use the prolog",
            lambda: str(hook_dir) in slurm.run("scontrol", "show", "config"),
            30,
        )
        syncer.start()
        yield kube, slurm, syncer, hook_dir
    finally:
        syncer.stop()
        slurm.cancel_all()
        local_slurm.restore_conf(conf, before)
        slurm.run("scontrol", "reconfigure", check=False)
        wait_for(
            "slurmctld to drop the prolog",
            lambda: str(hook_dir) not in slurm.run("scontrol", "show", "config", check=False),
            30,
        )
        slurm.undrain_all()
        for n in local_cluster.node_names:
            kube.reset_node(n)


def inject(hook_dir: Path, node: str, fault: str | None) -> None:
    path = hook_dir / f"inject-{node}"
    if fault is None:
        path.unlink(missing_ok=True)
    else:
        path.write_text(fault)


def job(slurm: Slurm, job_id: str) -> dict[str, str]:
    """``scontrol show job -o`` as key -> value."""
    text = slurm.run("scontrol", "show", "job", job_id, "-o")
    return dict(w.split("=", 1) for w in text.split() if "=" in w)


def finished(slurm: Slurm, job_id: str, timeout: float = 120) -> dict[str, str]:
    try:
        wait_for(
            f"job {job_id} to finish",
            lambda: job(slurm, job_id).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"),
            timeout,
            step=0.5,
        )
    except AssertionError as exc:
        seen = job(slurm, job_id)
        ctld = (slurm.info.logs_dir / "slurmctld.log").read_text(errors="replace")
        mine = [line for line in ctld.splitlines() if f"JobId={job_id}" in line][-30:]
        raise AssertionError(
            f"{exc}: {seen.get('JobState')} {seen.get('Reason')} {seen}\n" + "\n".join(mine)
        ) from None
    return job(slurm, job_id)


def health(kube: Kube, node: str) -> dict[str, Any] | None:
    c = kube.condition(node, HEALTH)
    return c if c is not None and c["status"] == "True" else None


def test_a_failed_prolog_check_drains_the_node_the_job_runs_elsewhere_and_the_repair_loop_owns_it(
    hooks: tuple[Kube, Slurm, RunningSyncer, Path], local_cluster: ClusterInfo
) -> None:
    kube, slurm, syncer, hook_dir = hooks
    bad, good = local_cluster.node_names[0], local_cluster.node_names[1]
    others = ",".join(local_cluster.node_names[2:])
    inject(hook_dir, bad, "xid=79,gpu=3")
    try:
        jid = slurm.run(
            "sbatch",
            "--parsable",
            "-o",
            "/dev/null",
            "-N1",
            f"--exclude={others}",
            "--wrap",
            "true",
        )
        done = finished(slurm, jid.strip())
    finally:
        inject(hook_dir, bad, None)
    assert done["JobState"] == "COMPLETED" and done["NodeList"] == good, done
    assert done["Restarts"] == "1"
    reason = slurm.drained(bad)
    assert reason is not None and reason.startswith("gpufleet: health gpu-xid: xid79"), reason
    assert slurm.drained(good) is None
    # the syncer reports the drain as fault slurm-drain for the lifecycle controller
    wait_for("SlurmHealthProblem on the drained node", lambda: health(kube, bad), 30)
    cond = health(kube, bad)
    assert cond is not None
    faults = conditions.faults_of(bad, HEALTH, "True", cond["message"])
    assert [f.kind for f in faults] == [FaultKind.SLURM_DRAIN]
    # in production the drain stays the health check's (the controller may hold it back)
    syncer.passed(kube, bad)
    assert (slurm.drained(bad) or "").startswith("gpufleet: health")
    # play the controller: it took the node out -> the syncer takes the drain over
    record = record_to_json(NodeRecord.new(bad, at=0.0, state=NodeState.DRAINING))
    kube.patch_node(bad, {"metadata": {"annotations": {well_known.ANNOTATION_RECORD: record}}})
    kube.set_state(bad, "draining")
    wait_for("the syncer to own the drain", lambda: slurm.drained(bad) == OWNED_DRAINING, 30)
    # verified: back to production -> resumed, the report cleared
    kube.set_state(bad, "verifying")
    syncer.passed(kube, bad)
    assert slurm.drained(bad) is not None, "not back in Slurm before verification"
    kube.set_state(bad, "production")
    wait_for("the node back in Slurm", lambda: slurm.drained(bad) is None, 30)
    wait_for("SlurmHealthProblem cleared", lambda: health(kube, bad) is None, 30)


def test_a_hung_check_is_cut_at_its_bound_and_the_job_runs(
    hooks: tuple[Kube, Slurm, RunningSyncer, Path], local_cluster: ClusterInfo
) -> None:
    _, slurm, _, hook_dir = hooks
    node = local_cluster.node_names[1]
    inject(hook_dir, node, "hang")
    try:
        jid = slurm.run(
            "sbatch", "--parsable", "-o", "/dev/null", "-N1", f"--nodelist={node}", "--wrap", "true"
        )
        done = finished(slurm, jid.strip())
    finally:
        inject(hook_dir, node, None)
    assert done["JobState"] == "COMPLETED" and done["Restarts"] == "0", done
    assert slurm.drained(node) is None
    runs = [r for r in (hook_dir / "log").read_text().splitlines() if f"node={node} " in r]
    assert any("status=unknown" in r and "did not finish within 8s" in r for r in runs), runs


@pytest.mark.parametrize("rank", [1, 0], ids=["a-worker", "the-rendezvous"])
def test_the_gang_preflight_requeues_a_job_without_the_node_that_did_not_answer(
    hooks: tuple[Kube, Slurm, RunningSyncer, Path], local_cluster: ClusterInfo, rank: int
) -> None:
    _, slurm, _, hook_dir = hooks
    # a 2-node job lands on the first two nodes; the one at ``rank`` never joins
    absent = local_cluster.node_names[rank]
    (hook_dir / "log").write_text("")
    inject(hook_dir, absent, "nic-down")
    try:
        jid = slurm.run("sbatch", "--parsable", "-o", "/dev/null", "-N2", "--wrap", "true").strip()
        done = finished(slurm, jid, timeout=240)
    finally:
        inject(hook_dir, absent, None)
    runs = (hook_dir / "log").read_text().splitlines()
    assert done["JobState"] == "COMPLETED", (done, runs)
    assert absent in done["ExcNodeList"], (done, runs)
    assert absent not in slurm.run("scontrol", "show", "hostnames", done["NodeList"]).split()
    assert int(done["Restarts"]) >= 1
    assert all(slurm.drained(n) is None for n in local_cluster.node_names)
    assert any(f"failed on {absent}: job {jid} requeued" in r for r in runs), runs
