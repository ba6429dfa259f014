"""Quarantined GPUs held in Slurm: the plan (pure) and the pass against a Slurm that gives a
new job the lowest free GPU, as Slurm's select plugin does."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpufleet.domain import gpu_holds as gh
from gpufleet.domain.records import NodeRecord, QuarantinedGpu, record_to_json
from gpufleet.domain.states import NodeState
from gpufleet.domain.well_known import ANNOTATION_RECORD
from gpufleet.slurm.gpu_holds import GpuHolds

NODE = "gpu-node-0000"


def test_gpu_indexes_reads_slurms_gres_detail() -> None:
    assert gh.gpu_indexes("Nodes=n CPU_IDs=0 Mem=1 GRES=gpu:1(IDX:3)") == (3,)
    assert gh.gpu_indexes("GRES=gpu:3(IDX:0,2-3)") == (0, 2, 3)
    assert gh.gpu_indexes("GRES=gpu:1") == ()


def test_landed_keeps_the_target_spaces_below_and_gives_up_above() -> None:
    assert gh.landed(5, (5,)) is gh.Landing.HELD
    assert gh.landed(5, (2,)) is gh.Landing.SPACER
    assert gh.landed(5, (6,)) is gh.Landing.BUSY
    assert gh.landed(5, None) is gh.Landing.BUSY


def test_wanted_only_on_a_node_in_production_that_slurm_knows() -> None:
    rec = replace(
        NodeRecord.new(NODE, at=0, state=NodeState.PRODUCTION),
        quarantined_gpus=(QuarantinedGpu(3, "", "xid-94", 1.0),),
    )
    assert gh.wanted(rec, True) == {3}
    assert gh.wanted(rec, False) == frozenset()
    assert gh.wanted(replace(rec, state=NodeState.DRAINING), True) == frozenset()
    assert gh.wanted(None, True) == frozenset()


def test_plan_keeps_one_holder_per_wanted_gpu_and_cancels_only_ours() -> None:
    ours = "gpufleet: holds quarantined GPU 3"
    jobs = [
        gh.HoldJob(10, NODE, True, (3,), ours),
        gh.HoldJob(11, NODE, True, (3,), ours),  # a duplicate
        gh.HoldJob(12, NODE, True, (1,), ours),  # a spacer left behind
        gh.HoldJob(13, NODE, False, (), ours),  # pending
        gh.HoldJob(14, NODE, True, (2,), "someone else's job of the same name"),
    ]
    p = gh.plan(frozenset({3, 6}), jobs)
    assert p.held == (3,)
    assert p.cancel == (11, 12, 13)
    assert p.acquire == (6,)
    assert gh.plan(frozenset(), jobs).cancel == (10, 11, 12, 13)


class LowestFree:
    """Slurm's GPU choice on one node: a new one-GPU job gets the lowest free index."""

    def __init__(self, busy: Sequence[int] = ()) -> None:
        self.busy = set(busy)
        self.jobs: dict[int, tuple[str, tuple[int, ...], str]] = {}
        self.next_id = 100
        self.cancelled: list[int] = []

    def free(self) -> list[int]:
        used = self.busy | {g for _, gpus, _ in self.jobs.values() for g in gpus}
        return [i for i in range(8) if i not in used]

    async def holders(self) -> list[gh.HoldJob]:
        return [gh.HoldJob(j, n, bool(g), g, c) for j, (n, g, c) in self.jobs.items()]

    async def submit(self, node: str, comment: str) -> int:
        self.next_id += 1
        free = self.free()
        self.jobs[self.next_id] = (node, tuple(free[:1]), comment)
        return self.next_id

    async def allocation(self, job_id: int) -> tuple[int, ...] | None:
        gpus = self.jobs[job_id][1]
        return gpus or None

    async def cancel(self, job_ids: Sequence[int]) -> None:
        for j in job_ids:
            self.cancelled.append(j)
            self.jobs.pop(j, None)


def _body(gpus: Sequence[int], state: NodeState = NodeState.PRODUCTION) -> dict[str, Any]:
    rec = replace(
        NodeRecord.new(NODE, at=0, state=state),
        quarantined_gpus=tuple(QuarantinedGpu(i, "", "xid-94", 1.0) for i in gpus),
    )
    return {"metadata": {"name": NODE, "annotations": {ANNOTATION_RECORD: record_to_json(rec)}}}


def _holds(slurm: LowestFree, body: dict[str, Any]) -> GpuHolds:
    return GpuHolds(slurm, nodes=lambda: {NODE: body}, slurm_known=lambda _: True, start_wait_s=0)


def test_the_pass_holds_exactly_the_quarantined_gpu_and_cancels_its_spacers() -> None:
    slurm = LowestFree(busy=[0, 1])  # a job runs on GPUs 0-1
    asyncio.run(_holds(slurm, _body([5])).reconcile())
    assert [g for _, g, _ in slurm.jobs.values()] == [(5,)]
    assert slurm.free() == [2, 3, 4, 6, 7]  # the spacers on 2, 3, 4 were cancelled
    assert len(slurm.cancelled) == 3
    asyncio.run(_holds(slurm, _body([5])).reconcile())  # held: nothing more is done
    assert len(slurm.jobs) == 1 and len(slurm.cancelled) == 3


def test_a_busy_gpu_is_left_for_the_next_pass_with_nothing_held() -> None:
    slurm = LowestFree(busy=[0, 3])  # the quarantined GPU 3 still runs its job
    asyncio.run(_holds(slurm, _body([3])).reconcile())
    assert slurm.jobs == {}
    slurm.busy.discard(3)
    asyncio.run(_holds(slurm, _body([3])).reconcile())
    assert [g for _, g, _ in slurm.jobs.values()] == [(3,)]


def test_released_or_out_of_production_the_holder_is_cancelled() -> None:
    slurm = LowestFree()
    asyncio.run(_holds(slurm, _body([2])).reconcile())
    assert [g for _, g, _ in slurm.jobs.values()] == [(2,)]
    asyncio.run(_holds(slurm, _body([2], NodeState.DRAINING)).reconcile())
    assert slurm.jobs == {}
