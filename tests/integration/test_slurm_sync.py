"""The syncer against a real apiserver and real Slurm: both directions, ownership, failures."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from slurm_support import Kube, RunningSyncer, Slurm, wait_for

from gpufleet.domain import well_known
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

OURS = well_known.SLURM_REASON_PREFIX


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
        slurm.undrain_all()
        for n in local_cluster.node_names:
            kube.reset_node(n)


@pytest.fixture
def node(env: tuple[Kube, Slurm, RunningSyncer], local_cluster: ClusterInfo) -> Iterator[str]:
    """A node in production and in service on both sides, restored afterwards."""
    kube, slurm, _ = env
    name = local_cluster.node_names[0]
    yield name
    kube.set_condition(name, "GpuProblem", "False", "Healthy")
    kube.patch_node(name, {"spec": {"unschedulable": None}})
    kube.set_state(name, "production")
    slurm.run("scontrol", "update", f"nodename={name}", "state=undrain", check=False)
    wait_for("node back in service", lambda: slurm.drained(name) is None, 15)


def test_fault_condition_drains_with_our_reason_and_production_resumes(env, node) -> None:
    kube, slurm, _ = env
    kube.set_condition(node, "GpuProblem", "True", "Xid79")
    reason = wait_for("our drain", lambda: slurm.drained(node), 5)
    assert reason == "gpufleet: GpuProblem Xid79"
    kube.set_condition(node, "GpuProblem", "False", "Healthy")
    wait_for("resume", lambda: slurm.drained(node) is None, 5)


def test_lifecycle_state_and_cordon_drain_and_return(env, node) -> None:
    kube, slurm, _ = env
    kube.set_state(node, "remediating")
    assert wait_for("drain", lambda: slurm.drained(node), 5) == "gpufleet: state remediating"
    kube.set_state(node, "production")
    kube.patch_node(node, {"spec": {"unschedulable": True}})
    wait_for("cordon reason", lambda: slurm.drained(node) == "gpufleet: cordoned", 5)
    kube.patch_node(node, {"spec": {"unschedulable": None}})
    wait_for("resume", lambda: slurm.drained(node) is None, 5)


def test_admin_drain_is_reported_and_never_removed(env, node) -> None:
    kube, slurm, _ = env
    slurm.drain(node, "bob: reseat dimm")
    cond = wait_for(
        "SlurmUnavailable condition",
        lambda: (
            (c := kube.condition(node, well_known.CONDITION_SLURM))
            and c["status"] == "True"
            and "bob" in c["message"]
            and c
        ),
        5,
    )
    assert "bob: reseat dimm" in cond["message"]
    wait_for(
        "annotation",
        lambda: (
            "bob: reseat dimm" in (kube.annotation(node, well_known.ANNOTATION_SLURM_STATE) or "")
        ),
        5,
    )
    # Kubernetes takes the node out and brings it back: the admin's drain stays.
    kube.set_state(node, "draining")
    time.sleep(1.5)
    assert slurm.drained(node) == "bob: reseat dimm"
    kube.set_state(node, "production")
    time.sleep(1.5)
    assert slurm.drained(node) == "bob: reseat dimm"
    # The admin resumes: the report goes away, and we never drained meanwhile.
    slurm.resume(node)
    wait_for(
        "report cleared",
        lambda: (
            kube.annotation(node, well_known.ANNOTATION_SLURM_STATE) is None
            and kube.condition(node, well_known.CONDITION_SLURM)["status"] == "False"
        ),
        5,
    )
    assert slurm.drained(node) is None


def test_early_resume_of_our_drain_is_reapplied(env, node) -> None:
    kube, slurm, _ = env
    kube.set_state(node, "verifying")
    wait_for("drain", lambda: slurm.drained(node) == "gpufleet: state verifying", 5)
    slurm.resume(node)
    wait_for("drain reapplied", lambda: slurm.drained(node) == "gpufleet: state verifying", 5)


def test_slurmrestd_unreachable_fails_closed_then_recovers(env, node) -> None:
    kube, slurm, syncer = env
    kube.set_state(node, "draining")
    wait_for("drain", lambda: slurm.drained(node) == "gpufleet: state draining", 5)
    slurm.signal("slurmrestd", signal.SIGSTOP)
    try:
        assert syncer.syncer is not None
        wait_for("syncer notices", lambda: not syncer.syncer.stats.slurm_up, 10)
        kube.set_state(node, "production")
        time.sleep(3)
        assert slurm.drained(node) == "gpufleet: state draining", "resumed without a Slurm view"
    finally:
        slurm.signal("slurmrestd", signal.SIGCONT)
    wait_for("resume after recovery", lambda: slurm.drained(node) is None, 15)


def test_slurmctld_restart_causes_no_wrong_drain_or_resume(env, local_cluster) -> None:
    kube, slurm, _ = env
    admin, ours, healthy, later = local_cluster.node_names[:4]
    slurm.drain(admin, "alice: firmware")
    kube.set_state(ours, "maintenance")
    wait_for("our drain", lambda: slurm.drained(ours) == "gpufleet: state maintenance", 5)
    slurm.run("scontrol", "shutdown", "slurmctld")
    wait_for("slurmctld gone", lambda: slurm.pid_of("slurmctld") is None, 20)
    # While slurmctld is away, Kubernetes changes its mind about one node.
    kube.set_state(later, "draining")
    time.sleep(1)
    slurm.start_slurmctld()
    wait_for("slurmctld back", lambda: slurm.nodes(), 30, step=0.5)
    seen_wrong: list[str] = []
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        nodes = slurm.nodes()
        if not nodes:
            continue
        if "DRAIN" not in (nodes[admin].get("state_flags") or []):
            seen_wrong.append(f"{admin} lost its admin drain")
        if "DRAIN" in (nodes[healthy].get("state_flags") or []):
            seen_wrong.append(f"{healthy} drained")
        if "DRAIN" not in (nodes[ours].get("state_flags") or []):
            seen_wrong.append(f"{ours} resumed")
        time.sleep(0.3)
    assert not seen_wrong, seen_wrong
    assert slurm.drained(admin) == "alice: firmware"
    wait_for("late drain applied", lambda: slurm.drained(later) == "gpufleet: state draining", 10)
    # Clean up: back to production, the admin resumes their own node.
    for n in (ours, later):
        kube.set_state(n, "production")
    wait_for("ours resumed", lambda: not slurm.drained(ours) and not slurm.drained(later), 10)
    slurm.resume(admin)
