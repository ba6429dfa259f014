"""The syncer's Prometheus metrics, driven through the syncer's own code paths
(poll, node-event reconcile, group-committed writes, requeue, lending, the poll
loop) with in-memory Slurm and Kubernetes; the values are read from the registry."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.clock import ManualClock
from gpufleet.domain import slurm_sync, well_known
from gpufleet.slurm.metrics import SLURM_STATES, SyncerMetrics
from gpufleet.slurm.syncer import Syncer, SyncSettings
from gpufleet.waits import within

from ..fakes import FakeSlurm
from .fakes import RecordingKube

IDLE = slurm_sync.SlurmView("idle", frozenset(), None)
OURS = slurm_sync.SlurmView("idle", frozenset({"DRAIN"}), "gpufleet: GpuProblem Xid79")


def node(name: str, problem: str | None = None, **annotations: str) -> dict[str, Any]:
    conditions = [{"type": "GpuProblem", "status": "True", "reason": problem}] if problem else []
    return {
        "metadata": {
            "name": name,
            "labels": {well_known.LABEL_STATE: "production"},
            "annotations": dict(annotations),
        },
        "spec": {},
        "status": {"conditions": conditions, "allocatable": {"nvidia.com/gpu": "8"}},
    }


def job(job_id: int, on: str, requeueable: bool = True) -> slurm_sync.JobView:
    return slurm_sync.JobView(job_id, 1, requeueable, frozenset({on}))


def make(
    slurm: FakeSlurm,
    nodes: dict[str, dict[str, Any]],
    *,
    clock: ManualClock | None = None,
    kube: RecordingKube | None = None,
    **settings: Any,
) -> tuple[Syncer, SyncerMetrics]:
    metrics = SyncerMetrics()
    s = Syncer(
        kube=kube or RecordingKube(),
        rest=slurm,
        scontrol=slurm,
        settings=SyncSettings(hold_taint=False, **settings),
        clock=clock or ManualClock(),
        metrics=metrics,
    )
    s.nodes = nodes
    return s, metrics


def value(m: SyncerMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def names(n: int) -> list[str]:
    return [f"gpu-node-{i:04d}" for i in range(n)]


def test_poll_sets_slurm_up_and_counts_failed_polls() -> None:
    slurm = FakeSlurm(names(2))
    s, m = make(slurm, {n: node(n) for n in names(2)})
    assert value(m, "gpufleet_syncer_slurm_up") == 0  # nothing heard yet

    async def go() -> None:
        assert await s.poll_slurm()
        assert value(m, "gpufleet_syncer_slurm_up") == 1
        slurm.down = True
        assert not await s.poll_slurm()
        assert not await s.poll_slurm()

    asyncio.run(go())
    assert value(m, "gpufleet_syncer_slurm_up") == 0
    assert value(m, "gpufleet_syncer_slurm_errors_total", op="poll") == 2
    assert value(m, "gpufleet_syncer_poll_seconds_count", result="ok") == 1
    assert value(m, "gpufleet_syncer_poll_seconds_count", result="failed") == 2
    assert s.stats.slurm_errors == 2  # the stats and the metrics count the same events


def test_a_node_event_drain_is_counted_with_its_latency_and_resume_too() -> None:
    all_ = names(3)
    slurm = FakeSlurm(all_)
    clock = ManualClock()
    faulted = {n: node(n, "Xid79") for n in all_[:2]}
    s, m = make(slurm, {**{n: node(n) for n in all_}, **faulted}, clock=clock)

    async def go() -> None:
        await s.poll_slurm()
        seen = clock.monotonic()
        clock.advance(0.03)  # the watch saw the change 30 ms before the write
        await asyncio.gather(*(s.reconcile(n, seen=seen) for n in faulted))
        for n in faulted:
            s.nodes[n] = node(n)
        clock.advance(0.5)
        await s.reconcile(all_[0], seen=clock.monotonic() - 0.2)

    asyncio.run(go())
    assert value(m, "gpufleet_syncer_drains_total") == 2 == s.stats.drains
    assert value(m, "gpufleet_syncer_resumes_total") == 1 == s.stats.resumes
    drain = "gpufleet_syncer_sync_latency_seconds"
    assert value(m, f"{drain}_count", verb="drain") == 2
    assert abs((value(m, f"{drain}_sum", verb="drain") or 0) - 0.06) < 1e-9
    assert value(m, f"{drain}_bucket", verb="drain", le="0.025") == 0
    assert value(m, f"{drain}_bucket", verb="drain", le="0.05") == 2
    assert value(m, f"{drain}_count", verb="resume") == 1
    assert abs((value(m, f"{drain}_sum", verb="resume") or 0) - 0.2) < 1e-9


def test_a_poll_driven_drain_counts_but_has_no_kubernetes_latency() -> None:
    # e.g. an admin resumed our drain early and the poll reapplies it
    slurm = FakeSlurm(names(1))
    s, m = make(slurm, {n: node(n, "Xid79") for n in names(1)})

    async def go() -> None:
        await s.poll_slurm()
        await s.reconcile(names(1)[0])

    asyncio.run(go())
    assert value(m, "gpufleet_syncer_drains_total") == 1
    assert value(m, "gpufleet_syncer_sync_latency_seconds_count", verb="drain") == 0


def test_refused_and_failed_writes_are_slurm_errors_not_drains() -> None:
    all_ = names(3)
    slurm = FakeSlurm(all_)
    slurm.refuse = {all_[1]}
    s, m = make(slurm, {n: node(n, "Xid79") for n in all_})

    async def go() -> None:
        await s.poll_slurm()
        await asyncio.gather(*(s.reconcile(n) for n in all_))

    asyncio.run(go())
    # the node scontrol refuses fails alone (and in any batch it was part of)
    refused = value(m, "gpufleet_syncer_slurm_errors_total", op="drain") or 0
    assert 1 <= refused <= 2
    assert value(m, "gpufleet_syncer_drains_total") == 2

    slurm2 = FakeSlurm(all_)
    s2, m2 = make(slurm2, {n: node(n, "Xid79") for n in all_})

    async def read_fails() -> None:
        await s2.poll_slurm()
        slurm2.down = True  # the fresh read before the write fails
        await asyncio.gather(*(s2.reconcile(n) for n in all_))

    asyncio.run(read_fails())
    assert (value(m2, "gpufleet_syncer_slurm_errors_total", op="read") or 0) >= 1
    assert value(m2, "gpufleet_syncer_drains_total") == 0
    assert value(m2, "gpufleet_syncer_slurm_errors_total", op="drain") == 0


def test_requeues_unrequeueable_jobs_and_refused_requeues() -> None:
    a, b = names(2)
    slurm = FakeSlurm([a, b])
    slurm.jobs = [job(1, a), job(2, a, requeueable=False), job(3, b), job(4, b, False)]
    slurm.refuse_requeue = {3}
    s, m = make(slurm, {a: node(a, "Xid79"), b: node(b, "Xid79")})

    async def go() -> None:
        await s.poll_slurm()
        await asyncio.gather(s.reconcile(a), s.reconcile(b))

    asyncio.run(go())
    assert slurm.requeued == [1]
    assert value(m, "gpufleet_syncer_requeues_total") == 1 == s.stats.requeues
    assert value(m, "gpufleet_syncer_slurm_errors_total", op="requeue") == 1
    assert value(m, "gpufleet_syncer_unrequeueable_jobs") == 2

    async def job_2_ends() -> None:
        slurm.jobs = [j for j in slurm.jobs if j.job_id != 2]
        await s.poll_slurm()
        await s.reconcile(a)

    asyncio.run(job_2_ends())
    assert value(m, "gpufleet_syncer_unrequeueable_jobs") == 1


def test_the_unrequeueable_report_is_cleared_when_our_drain_ends() -> None:
    """Also a report an earlier syncer left on the Node (the Node is the memory)."""
    (a,) = names(1)
    slurm = FakeSlurm([a])
    slurm.jobs = [job(2, a, requeueable=False)]
    kube = RecordingKube()
    stale = {well_known.ANNOTATION_SLURM_STUCK_JOBS: "2"}
    s, m = make(slurm, {a: node(a, "Xid79", **stale)}, kube=kube)

    async def fault_then_healthy() -> None:
        await s.poll_slurm()
        await s.reconcile(a)  # drains, reports job 2
        slurm.jobs = []
        s.nodes[a] = node(a, None, **stale)  # condition cleared; the report still on the Node
        await s.poll_slurm()
        await s.reconcile(a)  # undrains: the report goes

    asyncio.run(fault_then_healthy())
    cleared = {well_known.ANNOTATION_SLURM_STUCK_JOBS: None}
    assert (a, {"metadata": {"annotations": cleared}}) in kube.patches
    assert value(m, "gpufleet_syncer_unrequeueable_jobs") == 0
    assert well_known.ANNOTATION_SLURM_STUCK_JOBS not in s.nodes[a]["metadata"]["annotations"]


def test_kubernetes_refusals_are_counted() -> None:
    kube = RecordingKube()
    slurm = FakeSlurm(names(1))
    slurm.views[names(1)[0]] = slurm_sync.SlurmView("idle", frozenset({"DRAIN"}), "admin: x")
    s, m = make(slurm, {n: node(n) for n in names(1)}, kube=kube)
    kube.refuse = True

    async def go() -> None:
        await s.poll_slurm()
        await s.reconcile(names(1)[0])  # reporting the admin's drain is refused

    asyncio.run(go())
    assert value(m, "gpufleet_syncer_kube_errors_total") == 1


def test_node_gauges_follow_the_views_and_vanish_while_slurm_is_unknown() -> None:
    all_ = names(7)
    slurm = FakeSlurm(all_)
    slurm.views[all_[1]] = slurm_sync.SlurmView("mixed", frozenset(), None)
    slurm.views[all_[2]] = OURS
    slurm.views[all_[3]] = slurm_sync.SlurmView("allocated", frozenset({"DRAIN"}), "admin: x")
    slurm.views[all_[4]] = slurm_sync.SlurmView("down", frozenset(), "Not responding")
    slurm.views[all_[5]] = slurm_sync.SlurmView("future", frozenset(), None)
    nodes = {n: node(n) for n in all_}
    nodes[all_[2]] = node(all_[2], "Xid79")
    nodes[all_[6]] = node(all_[6], **{well_known.ANNOTATION_LENT_TO: "ml/train-0"})
    nodes["not-in-slurm"] = node("not-in-slurm")
    s, m = make(slurm, nodes)

    async def go() -> None:
        await s.poll_slurm()
        await asyncio.gather(*(s.reconcile(n) for n in all_))
        s.observe_views()

    asyncio.run(go())
    assert value(m, "gpufleet_syncer_kube_nodes") == 8
    assert value(m, "gpufleet_syncer_managed_nodes") == 7
    by_state = {
        st: value(m, "gpufleet_syncer_slurm_nodes", state=st) for st in (*SLURM_STATES, "future")
    }
    # node 6 is lent: the reconcile drained it (idle + DRAIN = drained)
    assert by_state == {
        "idle": 1,
        "mixed": 1,
        "allocated": 0,
        "draining": 1,
        "drained": 2,
        "down": 1,
        "unknown": 0,
        "future": 1,
    }
    assert value(m, "gpufleet_syncer_lent_nodes") == 1
    # the admin's drain and the DOWN node are reported on their Nodes (the bare
    # "future" node is unknown to Slurm, so nothing is decided or reported there)
    assert value(m, "gpufleet_syncer_foreign_holds") == 2

    async def slurm_goes_away() -> None:
        slurm.down = True
        await s.poll_slurm()
        s.observe_views()

    asyncio.run(slurm_goes_away())
    assert value(m, "gpufleet_syncer_managed_nodes") == 0
    assert value(m, "gpufleet_syncer_slurm_nodes", state="idle") is None
    assert value(m, "gpufleet_syncer_foreign_holds") == 2  # the Nodes still say so
    assert value(m, "gpufleet_syncer_lent_nodes") == 1


def test_a_state_that_empties_is_dropped_unless_it_is_a_fixed_one() -> None:
    m = SyncerMetrics()
    m.set_slurm_states([slurm_sync.SlurmView("future"), IDLE])
    assert value(m, "gpufleet_syncer_slurm_nodes", state="future") == 1
    m.set_slurm_states([IDLE])
    assert value(m, "gpufleet_syncer_slurm_nodes", state="future") is None
    assert value(m, "gpufleet_syncer_slurm_nodes", state="drained") == 0


def test_the_poll_loop_sets_the_gauges_after_each_pass() -> None:
    all_ = names(2)
    slurm = FakeSlurm(all_)
    s, m = make(slurm, {all_[0]: node(all_[0], "Xid79"), all_[1]: node(all_[1])})

    async def go() -> None:
        loop = asyncio.ensure_future(s.slurm_loop())
        await within(5, s.synced.wait())
        loop.cancel()

    asyncio.run(go())
    assert value(m, "gpufleet_syncer_slurm_up") == 1
    assert value(m, "gpufleet_syncer_managed_nodes") == 2
    assert value(m, "gpufleet_syncer_slurm_nodes", state="drained") == 1
    assert value(m, "gpufleet_syncer_slurm_nodes", state="idle") == 1


def test_lending_and_returning_are_counted() -> None:
    a, b = names(2)
    slurm = FakeSlurm([a, b])
    slurm.views[b] = OURS  # b is out: only a can be lent
    kube = RecordingKube()
    s, m = make(slurm, {a: node(a), b: node(b, "Xid79")}, kube=kube, preempt_priority=1000)
    assert s.lender is not None
    pod = {
        "metadata": {"namespace": "ml", "name": "train-0", "uid": "u1"},
        "spec": {
            "priority": 2000,
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }

    async def go() -> None:
        await s.poll_slurm()
        await s.lender.consider(pod)  # type: ignore[union-attr]
        s.observe_views()
        assert value(m, "gpufleet_syncer_lends_total") == 1
        assert value(m, "gpufleet_syncer_lent_nodes") == 1
        assert slurm.views[a].reason == "gpufleet: lent to kubernetes"
        await s.lender.tick()  # type: ignore[union-attr]  # the pod is gone: return it
        s.observe_views()

    asyncio.run(go())
    assert value(m, "gpufleet_syncer_returns_total") == 1
    assert value(m, "gpufleet_syncer_lent_nodes") == 0
    assert not slurm.views[a].drained
    assert value(m, "gpufleet_syncer_drains_total") == 1
    assert value(m, "gpufleet_syncer_resumes_total") == 1


def test_a_syncer_without_metrics_keeps_a_private_registry() -> None:
    slurm = FakeSlurm(names(1))
    s = Syncer(kube=RecordingKube(), rest=slurm, scontrol=slurm)
    assert asyncio.run(s.poll_slurm())
    assert s.metrics.registry.get_sample_value("gpufleet_syncer_slurm_up") == 1
    assert SyncerMetrics().registry.get_sample_value("gpufleet_syncer_slurm_up") == 0


def test_serve_exposes_the_registry_on_loopback_and_stops() -> None:
    m = SyncerMetrics()
    m.drains.inc(3)
    m.slurm_up.set(1)
    port = m.endpoint.serve(0, "127.0.0.1")
    try:
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        m.endpoint.stop()
    assert "gpufleet_syncer_drains_total 3.0" in text
    assert "gpufleet_syncer_slurm_up 1.0" in text
    m.endpoint.stop()  # twice is fine


def test_the_cli_has_the_metrics_flags() -> None:
    r = CliRunner().invoke(app, ["syncer", "run", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "--metrics-port" in r.output and "--metrics-address" in r.output
    assert "127.0.0.1" in r.output
