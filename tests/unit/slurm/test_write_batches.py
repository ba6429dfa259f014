"""The syncer's group-committed writes, with in-memory Slurm and Kubernetes
(the real daemons are in tests/integration/test_slurm_sync.py): a burst is read
once and drained with one scontrol call per reason, every write still follows a
fresh read, a foreign drain seen in that read is kept, and an unknown view
writes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.domain import slurm_sync, well_known
from gpufleet.slurm.syncer import Syncer, SyncSettings

from ..fakes import FakeSlurm
from .fakes import RecordingKube


def node(name: str, problem: str | None = None, state: str = "production") -> dict[str, Any]:
    conditions = [{"type": "GpuProblem", "status": "True", "reason": problem}] if problem else []
    return {
        "metadata": {"name": name, "labels": {well_known.LABEL_STATE: state}, "annotations": {}},
        "spec": {},
        "status": {"conditions": conditions},
    }


def syncer(slurm: FakeSlurm, nodes: dict[str, dict[str, Any]]) -> Syncer:
    s = Syncer(
        kube=RecordingKube(),
        rest=slurm,
        scontrol=slurm,
        settings=SyncSettings(hold_taint=False),
    )
    s.nodes = nodes
    s.slurm = dict(slurm.views)
    s.jobs = []
    return s


def names(n: int) -> list[str]:
    return [f"gpu-node-{i:04d}" for i in range(n)]


def test_a_burst_is_read_once_and_drained_with_one_call_per_reason() -> None:
    all_ = names(60)
    slurm = FakeSlurm(all_)
    faulted = {n: node(n, "Xid79" if i % 2 else "Xid48") for i, n in enumerate(all_[:50])}
    s = syncer(slurm, {**{n: node(n) for n in all_}, **faulted})

    async def burst() -> None:
        await asyncio.gather(*(s.reconcile(n) for n in faulted))

    asyncio.run(burst())
    assert all(slurm.views[n].ours for n in faulted)
    assert not any(slurm.views[n].drained for n in all_[50:])
    # at most two batches (the first may go alone while the rest queue up), each
    # read with one request and drained with one call per reason
    assert len(slurm.reads) <= 2 and "*" in slurm.reads
    drains = [c for c in slurm.calls if c[0] == "drain"]
    assert len(drains) <= 4
    assert {c[2] for c in drains} == {"gpufleet: GpuProblem Xid79", "gpufleet: GpuProblem Xid48"}
    assert s.stats.drains == 50 and len(s.stats.timings) == 50


def test_a_foreign_drain_seen_in_the_fresh_read_is_kept() -> None:
    all_ = names(4)
    slurm = FakeSlurm(all_)
    s = syncer(slurm, {n: node(n, "Xid79") for n in all_})
    # an admin drained node 2 after the snapshot was taken
    slurm.views[all_[2]] = slurm_sync.SlurmView("idle", frozenset({"DRAIN"}), "admin: cable")

    async def go() -> None:
        await asyncio.gather(*(s.reconcile(n) for n in all_))

    asyncio.run(go())
    assert slurm.views[all_[2]].reason == "admin: cable"
    assert all(slurm.views[n].ours for n in all_ if n != all_[2])


def test_slurmrestd_down_at_the_fresh_read_writes_nothing() -> None:
    all_ = names(5)
    slurm = FakeSlurm(all_)
    s = syncer(slurm, {n: node(n, "Xid79") for n in all_})
    slurm.down = True

    async def go() -> None:
        await asyncio.gather(*(s.reconcile(n) for n in all_))

    asyncio.run(go())
    assert slurm.calls == [] and s.stats.drains == 0


def test_a_node_scontrol_refuses_does_not_hold_back_the_rest() -> None:
    all_ = names(6)
    slurm = FakeSlurm(all_)
    s = syncer(slurm, {n: node(n, "Xid79") for n in all_})
    slurm.refuse = {all_[3]}

    async def go() -> None:
        await asyncio.gather(*(s.reconcile(n) for n in all_))

    asyncio.run(go())
    assert [n for n in all_ if slurm.views[n].ours] == [n for n in all_ if n != all_[3]]
    assert any("[" in c[1] for c in slurm.calls)  # tried together, then one by one
    assert ("drain", all_[3], "gpufleet: GpuProblem Xid79") in slurm.calls
    assert s.stats.drains == 5


def test_undrain_is_batched_too_and_only_ours() -> None:
    all_ = names(4)
    slurm = FakeSlurm(all_)
    ours = slurm_sync.SlurmView("idle", frozenset({"DRAIN"}), "gpufleet: GpuProblem Xid79")
    for n in all_[:3]:
        slurm.views[n] = ours
    slurm.views[all_[3]] = slurm_sync.SlurmView("idle", frozenset({"DRAIN"}), "admin: keep")
    s = syncer(slurm, {n: node(n) for n in all_})

    async def go() -> None:
        await asyncio.gather(*(s.reconcile(n) for n in all_))

    asyncio.run(go())
    assert not any(slurm.views[n].drained for n in all_[:3])
    assert slurm.views[all_[3]].reason == "admin: keep"
    assert all(c[0] == "undrain" and "0003" not in c[1] for c in slurm.calls)
