"""Burn-in of an NVLink domain as a unit on the local cluster's real Slurm: three trays
(KWOK Nodes labelled into one NVLink domain, in burn-in, drained by gpufleet in Slurm
as the syncer would) run ``gpufleet burn-in domain`` -- one srun across their slurmds, a
gloo all-reduce over 127.0.0.1 across the three and over each pair. It passes and leaves
the trays drained as they were; with one tray made slow it fails and names that tray;
a tray running a job stops it before anything changes (a tray in production: the command's
unit test)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_support import Kube, Slurm
from waiting import wait_for

from gpufleet.domain import domain_burnin, well_known
from gpufleet.local.cluster import ClusterInfo

pytestmark = pytest.mark.integration

GPUFLEET = str(Path(sys.executable).with_name("gpufleet"))
LABEL = "network.topology.nvidia.com/accelerator"
DOMAIN = "nvl-burnin-test"
DRAIN = "gpufleet: state burn-in"
KEPT = well_known.ANNOTATION_DOMAIN_BURN_IN


@pytest.fixture(scope="module")
def domain(local_cluster: ClusterInfo) -> Iterator[tuple[Kube, Slurm, list[str]]]:
    """The first three nodes: one NVLink domain, in burn-in, drained by gpufleet."""
    kube, slurm = Kube(local_cluster), Slurm(local_cluster)
    trays = local_cluster.node_names[:3]
    for t in trays:
        kube.reset_node(t)
        kube.patch_node(
            t, {"metadata": {"labels": {LABEL: DOMAIN, well_known.LABEL_STATE: "burn-in"}}}
        )
        slurm.drain(t, DRAIN)
    try:
        yield kube, slurm, trays
    finally:
        slurm.cancel_all()
        for t in trays:
            kube.patch_node(t, {"metadata": {"labels": {LABEL: None}}})
            kube.reset_node(t)
        slurm.undrain_all()


def burn_in(info: ClusterInfo, *extra: str) -> tuple[int, dict[str, Any], str]:
    argv = [GPUFLEET, "burn-in", "domain", DOMAIN, "--backend", "simulated", "-o", "json"]
    done = subprocess.run(
        [*argv, "--timeout", "120", "--sizes", "4194304", "--iters", "5", *extra],
        env={**info.kube_env(), **info.slurm_env()},
        capture_output=True,
        text=True,
        timeout=240,
    )
    try:
        data = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        data = {}
    print(f"gpufleet burn-in domain {' '.join(extra)}: exit {done.returncode} {data}")
    return done.returncode, data, done.stderr


def test_a_healthy_domain_passes_and_its_trays_stay_drained_as_they_were(
    domain: tuple[Kube, Slurm, list[str]], local_cluster: ClusterInfo
) -> None:
    kube, slurm, trays = domain
    code, data, err = burn_in(local_cluster)
    assert code == 0, (code, data, err)
    assert data["passed"] and data["bad"] == [] and data["trays"] == trays
    assert data["busbwGbps"] > 0
    assert sorted(data["pairs"]) == sorted(
        domain_burnin.pair_test(a, b) for a, b in domain_burnin.ring_pairs(trays)
    )
    assert all(bw is not None and bw > 0 for bw in data["pairs"].values()), data
    # the reservation is gone and every tray is drained again with gpufleet's reason
    assert "gpufleet-burnin" not in slurm.run("scontrol", "show", "reservation")
    assert all(slurm.drained(t) == DRAIN for t in trays), [slurm.drained(t) for t in trays]
    kept = domain_burnin.read_recorded(
        kube.annotation(trays[0], well_known.ANNOTATION_DOMAIN_BURN_IN)
    )
    assert kept is not None and kept.passed and kept.domain == DOMAIN
    # the fourth node, in no domain, was never part of it
    assert kube.annotation(local_cluster.node_names[3], KEPT) is None


def test_a_slow_tray_fails_the_domain_and_is_named(
    domain: tuple[Kube, Slurm, list[str]], local_cluster: ClusterInfo
) -> None:
    kube, slurm, trays = domain
    slow = trays[1]
    code, data, err = burn_in(local_cluster, "--inject-slow", slow)
    assert code == 1, (code, data, err)
    assert not data["passed"] and data["bad"] == [slow], data
    assert f"tray {slow} is bad in every pair it is in" in data["reason"]
    kept = domain_burnin.read_recorded(
        kube.annotation(trays[2], well_known.ANNOTATION_DOMAIN_BURN_IN)
    )
    assert kept is not None and not kept.passed and kept.bad == (slow,)
    assert all(slurm.drained(t) == DRAIN for t in trays)


def test_it_never_starts_on_a_tray_with_a_job(
    domain: tuple[Kube, Slurm, list[str]], local_cluster: ClusterInfo
) -> None:
    _, slurm, trays = domain
    slurm.resume(trays[2])
    jid = slurm.run(
        "sbatch", "--parsable", "-o", "/dev/null", "-w", trays[2], "--wrap", "sleep 120"
    ).strip()
    try:
        # The refusal is of a job that runs: one still pending (Slurm starts it within a
        # second or two, longer under load) is not on the tray yet.
        wait_for(
            f"job {jid} running",
            lambda: slurm.run("squeue", "-h", "-j", jid, "-o", "%T").strip() == "RUNNING",
            60,
            step=0.5,
        )
        code, _, err = burn_in(local_cluster)
        assert code == 2 and f"job(s) on the trays: {jid}@{trays[2]}" in err, (code, err)
    finally:
        slurm.run("scancel", jid)
        slurm.drain(trays[2], DRAIN)
    assert "gpufleet-burnin" not in slurm.run("scontrol", "show", "reservation")
