"""The pod scheduler in the deterministic simulation (:mod:`gpufleet.dst.pods`): bounded
runs with the real loop hold every invariant and bind pods; its Slurm jobs start only on
nodes Slurm would give; invariant 1 counts its pods from their binding; 14-16 fire on
the acts that break them."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.domain import pod_groups as pg
from gpufleet.dst import pods
from gpufleet.dst.invariants import Invariants
from gpufleet.dst.kube import Write, node_body
from gpufleet.dst.runner import Result, Spec, run
from gpufleet.dst.scenario import Config, Env, dst_policy, with_pod_scheduler
from gpufleet.dst.world import World
from gpufleet.kubeapi import NODES, PODS
from gpufleet.slurm.errors import SlurmCommandFailed
from gpufleet.slurm.pod_scheduler import COMPONENT, PodScheduler, View

RUNS = with_pod_scheduler(Config(duration=300.0, calm_s=100.0), **{"pod-group": 20})
SEEDS = (0, 2)
"""About 1 s each; both bind pods among faults, drains, resets and other work."""


def _done(r: Result, call: str) -> int:
    return sum(
        1
        for ln in r.lines
        if ln.proc.startswith(pods.PROC)
        and ln.call.startswith(call)
        and ln.outcome.startswith(("ok", "done"))
    )


def test_runs_with_the_pod_scheduler_hold_every_invariant_and_bind_pods() -> None:
    for seed in SEEDS:
        r = run(Spec(seed, RUNS))
        assert r.violation is None, (seed, r.violation)
        assert _done(r, "sbatch") > 0, seed
        assert _done(r, "bind") > 0, (seed, "no pod was bound: the path was not exercised")
        assert _done(r, "scancel") > 0, (seed, "no group ended with its job cancelled")


CORDONED = Spec(
    1,
    with_pod_scheduler(Config(duration=40.0, calm_s=20.0)),
    events=(
        Env(0.5, "kill", ("syncer", 100)),
        Env(1.0, "admin-taint", ("n1", "cordon")),
        Env(5.0, "pod-group", (1, True, 200)),
    ),
    choices=(),
)
"""Slurm gives the group's job n1, which Kubernetes has cordoned (the syncer, down, has
not drained it in Slurm yet)."""


def _nodes_of(r: Result, call: str) -> list[str]:
    return [
        ln.call.split()[-1]
        for ln in r.lines
        if ln.proc.startswith(pods.PROC) and ln.call.startswith(call) and ln.outcome == "ok"
    ]


def test_a_job_on_a_node_kubernetes_finds_unfit_is_requeued_off_it_and_bound_elsewhere() -> None:
    r = run(CORDONED)
    assert r.violation is None, r.violation
    assert _done(r, "scontrol requeue") >= 1
    bound = _nodes_of(r, "bind")
    assert len(bound) == 1 and bound[0] != "n1", bound


def test_invariant_14_fails_a_scheduler_that_binds_onto_a_node_it_saw_unfit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = PodScheduler.read

    async def blind(self: PodScheduler) -> View:
        view = await real(self)
        view.nodes = {n: pg.NodeFit(n, True) for n in view.nodes}
        return view

    monkeypatch.setattr(PodScheduler, "read", blind)
    r = run(CORDONED)
    assert r.violation is not None and r.violation.category == "14/unfit-in-view", r.violation
    assert r.violation.node == "n1"


def _world() -> tuple[World, pods.PodChecks, pods.PodQueue]:
    w = World(1, ["n1", "n2", "n3", "n4"], replay=[], shuffle=False)
    w.stop_on_violation = False
    for n in w.node_names:
        w.api.create("kubelet", NODES, node_body(n), None)
    checks = pods.PodChecks(w)
    w.api.on_write.append(checks.on_write)
    return w, checks, pods.PodQueue(w, checks)


def _request(name: str, nodes: int) -> pg.JobRequest:
    key = pg.GroupKey(pods.WORK_NS, "group", name)
    return pg.JobRequest(key, key.job_name, key.comment, nodes, gpus_per_node=8)


def test_pod_jobs_start_only_on_nodes_slurm_would_give_and_a_requeue_keeps_the_id() -> None:
    w, _, queue = _world()
    for n in ("n1", "n2", "n3"):
        w.slurm.admin_drain(n, "admin: bios update")
    one = queue.submit(_request("a", 1))
    two = queue.submit(_request("b", 2))
    assert w.slurm.jobs[one].nodes == ("n4",)
    assert two not in w.slurm.jobs  # one free node, two asked: pending
    w.slurm.admin_resume("n1")
    queue.cycle()
    assert two not in w.slurm.jobs  # n4 is allocated: still one free node
    w.slurm.admin_resume("n2")
    queue.cycle()
    assert w.slurm.jobs[two].nodes == ("n1", "n2")
    queue.requeue(two)
    queue.exclude(two, ["n1"])
    assert queue.jobs[two].state == "PENDING" and two not in w.slurm.jobs
    queue.cycle()
    assert two not in w.slurm.jobs  # n1 excluded, n3 drained: one free node
    w.slurm.admin_resume("n3")
    queue.cycle()
    assert w.slurm.jobs[two].nodes == ("n2", "n3")
    listed = {j.job_id: j for j in queue.listing()}
    assert listed[one].state == "RUNNING" and listed[one].key.name == "a"
    lost = w.slurm.reboot("n4")
    assert [j.id for j in lost] == [one] and queue.jobs[one].state == "NODE_FAIL"


def test_invariant_15_fails_a_second_live_job_for_one_group() -> None:
    w, _, queue = _world()
    first = queue.submit(_request("a", 1))
    queue.submit(_request("b", 1))
    assert not w.violations
    queue.cancel(first)
    queue.submit(_request("a", 1))  # the first one ended: fine
    assert not w.violations
    queue.submit(_request("a", 1))
    assert [v.category for v in w.violations] == ["15"]


def test_invariant_16_fails_a_cancel_of_another_job_and_a_write_to_another_pod() -> None:
    w, checks, queue = _world()
    other = w.slurm.start_job("n1")
    with pytest.raises(SlurmCommandFailed):
        queue.cancel(other.id)
    assert [v.category for v in w.violations] == ["16b"]
    assert other.id in w.slurm.jobs
    pod: dict[str, Any] = {"metadata": {"name": "x"}, "spec": {"schedulerName": "default"}}
    checks.on_write(Write(COMPONENT, str(PODS), "work", "x", "evict", pod, None, 0.0))
    assert [v.category for v in w.violations] == ["16b", "16a"]


def test_invariant_1_counts_a_scheduler_pod_from_its_binding() -> None:
    w, _, _ = _world()
    inv = Invariants(w, dst_policy())
    inv.attach()
    pods.pod_group(w, 1, True, 500)
    name = next(p["metadata"]["name"] for p in w.api.all(PODS))
    uid = w.api.get_object(PODS, name, pods.WORK_NS)["metadata"]["uid"]
    w.loop.run_until(10.0)
    w.api.bind("binder", pods.WORK_NS, name, uid, "n1")
    assert [p["metadata"]["name"] for p in w.pods_on("n1")] == [name]
    # bound after the act's last look (at 5): in flight, not a violation
    inv._under_work("n1", "reset", "", sent=6.0, looked=5.0)
    assert not w.violations and inv.in_flight
    # a look after the binding: the pod is work on the node
    inv._under_work("n1", "reset", "", sent=12.0, looked=11.0)
    assert [v.invariant for v in w.violations] == ["1"]
