"""The syncer against a real apiserver and real Slurm: both directions, ownership, failures,
and its Prometheus metrics scraped over HTTP."""

from __future__ import annotations

import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from slurm_support import Kube, RunningSyncer, Slurm, wait_for

from gpufleet.domain import well_known
from gpufleet.local.cluster import ClusterInfo
from gpufleet.slurm.metrics import SyncerMetrics
from gpufleet.slurm.syncer import SyncSettings

pytestmark = pytest.mark.integration

OURS = well_known.SLURM_REASON_PREFIX


@pytest.fixture(scope="module")
def metrics_url() -> Iterator[tuple[SyncerMetrics, str]]:
    """The module's syncer's metrics, served on a free loopback port."""
    metrics = SyncerMetrics()
    port = metrics.endpoint.serve(0, "127.0.0.1")
    try:
        yield metrics, f"http://127.0.0.1:{port}/metrics"
    finally:
        metrics.endpoint.stop()


def scrape(url: str) -> dict[str, float]:
    """``name{labels}`` (labels sorted, as in the exposition) -> value, over HTTP."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


@pytest.fixture(scope="module")
def env(
    local_cluster: ClusterInfo, metrics_url: tuple[SyncerMetrics, str]
) -> Iterator[tuple[Kube, Slurm, RunningSyncer]]:
    kube, slurm = Kube(local_cluster), Slurm(local_cluster)
    for n in local_cluster.node_names:
        kube.reset_node(n)  # start clean, whatever earlier tests left
        kube.set_state(n, "production")
    settings = SyncSettings(poll_interval_s=0.5, hold_taint=False)
    syncer = RunningSyncer(local_cluster, settings, metrics=metrics_url[0])
    syncer.start()
    assert syncer.syncer is not None and syncer.syncer.metrics is metrics_url[0]
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
    kube, slurm, syncer = env
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
    syncer.passed(kube, node)
    assert slurm.drained(node) == "bob: reseat dimm"
    kube.set_state(node, "production")
    syncer.passed(kube, node)
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


def test_metrics_scraped_over_http_show_the_drain_and_slurm_up(
    env, node, metrics_url, local_cluster
) -> None:
    kube, slurm, _ = env
    _, url = metrics_url
    polls = 'gpufleet_syncer_poll_seconds_count{result="ok"}'
    first = scrape(url)[polls]
    # a whole poll pass after this point, so the gauges no longer show an earlier test
    before = wait_for("a fresh poll pass", lambda: (m := scrape(url))[polls] >= first + 2 and m, 5)
    assert before["gpufleet_syncer_slurm_up"] == 1
    assert before["gpufleet_syncer_managed_nodes"] == len(local_cluster.node_names)
    kube.set_state(node, "maintenance")
    wait_for("drain", lambda: slurm.drained(node) == "gpufleet: state maintenance", 5)
    after = wait_for(
        "the drain counted and the node seen drained",
        lambda: (
            (m := scrape(url))["gpufleet_syncer_drains_total"]
            > before["gpufleet_syncer_drains_total"]
            and m['gpufleet_syncer_slurm_nodes{state="drained"}']
            > before['gpufleet_syncer_slurm_nodes{state="drained"}']
            and m
        ),
        5,
    )
    assert after["gpufleet_syncer_slurm_up"] == 1
    assert after['gpufleet_syncer_slurm_errors_total{op="drain"}'] == 0
    kube.set_state(node, "production")
    wait_for(
        "the resume counted",
        lambda: (
            scrape(url)["gpufleet_syncer_resumes_total"] > before["gpufleet_syncer_resumes_total"]
        ),
        5,
    )


def test_slurmrestd_unreachable_fails_closed_then_recovers(env, node, metrics_url) -> None:
    kube, slurm, syncer = env
    kube.set_state(node, "draining")
    wait_for("drain", lambda: slurm.drained(node) == "gpufleet: state draining", 5)
    slurm.signal("slurmrestd", signal.SIGSTOP)
    try:
        assert syncer.syncer is not None
        wait_for("syncer notices", lambda: not syncer.syncer.stats.slurm_up, 10)
        wait_for(
            "slurm_up 0 over HTTP",
            lambda: scrape(metrics_url[1])["gpufleet_syncer_slurm_up"] == 0,
            5,
        )
        kube.set_state(node, "production")
        syncer.passed(kube, node)  # passes whose poll failed: no Slurm view, no resume
        assert slurm.drained(node) == "gpufleet: state draining", "resumed without a Slurm view"
    finally:
        slurm.signal("slurmrestd", signal.SIGCONT)
    wait_for("resume after recovery", lambda: slurm.drained(node) is None, 15)


def test_slurmctld_restart_causes_no_wrong_drain_or_resume(env, local_cluster) -> None:
    kube, slurm, syncer = env
    admin, ours, healthy, later = local_cluster.node_names[:4]
    slurm.drain(admin, "alice: firmware")
    kube.set_state(ours, "maintenance")
    wait_for("our drain", lambda: slurm.drained(ours) == "gpufleet: state maintenance", 5)
    slurm.run("scontrol", "shutdown", "slurmctld")
    wait_for("slurmctld gone", lambda: slurm.pid_of("slurmctld") is None, 20)
    # While slurmctld is away, Kubernetes changes its mind about one node.
    kube.set_state(later, "draining")
    syncer.passed(kube, later)  # seen while slurmctld is away: nothing could be written
    slurm.start_slurmctld()
    wait_for("slurmctld back", lambda: slurm.nodes(), 30, step=0.5)
    assert syncer.syncer is not None
    stats = syncer.syncer.stats
    # Watch Slurm until the syncer has applied the late drain (a pass with slurmctld back
    # reconciled every node) and finished two passes more: a wrong resume or drain would
    # have happened by then.
    seen_wrong: list[str] = []
    applied_at: int | None = None
    deadline = time.monotonic() + 30
    while applied_at is None or stats.passes < applied_at + 2:
        assert time.monotonic() < deadline, "the late drain was never applied"
        nodes = slurm.nodes()
        if not nodes:
            time.sleep(0.1)
            continue
        if applied_at is None and slurm.drained(later) == "gpufleet: state draining":
            applied_at = stats.passes
        if "DRAIN" not in (nodes[admin].get("state_flags") or []):
            seen_wrong.append(f"{admin} lost its admin drain")
        if "DRAIN" in (nodes[healthy].get("state_flags") or []):
            seen_wrong.append(f"{healthy} drained")
        if "DRAIN" not in (nodes[ours].get("state_flags") or []):
            seen_wrong.append(f"{ours} resumed")
        time.sleep(0.1)
    assert not seen_wrong, seen_wrong
    assert slurm.drained(admin) == "alice: firmware"
    # Clean up: back to production, the admin resumes their own node.
    for n in (ours, later):
        kube.set_state(n, "production")
    wait_for("ours resumed", lambda: not slurm.drained(ours) and not slurm.drained(later), 10)
    slurm.resume(admin)


SELECTED = "gpufleet-test/slurm-sync"
"""The label the selector test's syncer selects on (``SELECTED=yes``)."""


def test_node_selector_manages_matching_nodes_and_drops_one_that_stops_matching(
    env, local_cluster
) -> None:
    """``node_selector`` is a labelSelector on the syncer's Node list and watch: a matching
    Node is drained for its problem, one that never matched is left alone, and one whose
    label is removed is dropped (the apiserver sends DELETED) and no longer resumed.

    Last in this module: it stops the module's syncer (two syncers would fight over the
    same Slurm nodes) and runs its own with the selector.
    """
    kube, slurm, module_syncer = env
    kept, dropped, outside = local_cluster.node_names[:3]
    module_syncer.stop()
    for n in (kept, dropped):
        kube.patch_node(n, {"metadata": {"labels": {SELECTED: "yes"}}})
    settings = SyncSettings(poll_interval_s=0.5, hold_taint=False, node_selector=f"{SELECTED}=yes")
    syncer = RunningSyncer(local_cluster, settings).start()
    try:
        assert syncer.syncer is not None
        assert set(syncer.syncer.nodes) == {kept, dropped}, "the list is filtered"

        # A matching node is managed; a node outside the selector is not, whatever its state.
        kube.set_condition(dropped, "GpuProblem", "True", "Xid79")
        kube.set_condition(outside, "GpuProblem", "True", "Xid79")
        reason = wait_for("our drain", lambda: slurm.drained(dropped), 10)
        assert reason == "gpufleet: GpuProblem Xid79"
        syncer.passed(kube, dropped)
        assert slurm.drained(outside) is None, "a node outside the selector was drained"

        # The label goes: the watch drops the Node, so its recovery is not acted on.
        kube.patch_node(dropped, {"metadata": {"labels": {SELECTED: None}}})
        wait_for("the Node dropped by the watch", lambda: dropped not in syncer.syncer.nodes, 10)
        kube.set_condition(dropped, "GpuProblem", "False", "Healthy")
        # A later change on a matching node: once the watch has delivered it (events come
        # in resourceVersion order) and two passes ran, the syncer has had its chance.
        kube.set_condition(kept, "GpuProblem", "True", "Xid79")
        assert wait_for("kept drained", lambda: slurm.drained(kept), 10) == (
            "gpufleet: GpuProblem Xid79"
        )
        syncer.passed(kube, kept)
        assert set(syncer.syncer.nodes) == {kept}
        assert slurm.drained(dropped) == "gpufleet: GpuProblem Xid79", (
            "a node outside the selector was resumed"
        )
    finally:
        syncer.stop()
        for n in (kept, dropped, outside):
            kube.patch_node(n, {"metadata": {"labels": {SELECTED: None}}})
            kube.set_condition(n, "GpuProblem", "False", "Healthy")
        slurm.undrain_all()
