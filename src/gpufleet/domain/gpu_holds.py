"""Keeping Slurm's jobs off a quarantined GPU: a job of gpufleet's holds it (pure).

Slurm has no command that takes one GPU of a node out of scheduling while jobs run on the
others (docs/decisions/0234, asked of Slurm 24.11): ``scontrol update NodeName=...
Gres=gpu:7`` is refused for GPUs bound to device files, a reservation of ``TRES=gres/gpu=1``
is refused (and would hold a count, not a GPU), and a changed gres.conf would shift the GPU
indexes under the running jobs. A job can hold one: a job of gpufleet's, pinned to the node
with ``--gres=gpu:1``, running ``sleep`` for as long as the GPU is quarantined. Slurm gives a
new job the lowest free GPU index, so the syncer submits holders one at a time
(:func:`landed`): one that lands on a lower free GPU is kept for the moment (a spacer) and the
next lands higher, until one lands on the quarantined GPU; the spacers are then cancelled (a
few seconds of a healthy GPU held). A holder that lands above it means the quarantined GPU is
busy (its job still runs): everything of that try is cancelled and the next pass tries again.

Ownership: a holder is named :data:`HOLD_NAME` and its comment starts with ``gpufleet:``;
nothing else is ever cancelled. The syncer releases a GPU (cancels its holder) when the
record no longer lists it, and every holder of a node that left production (its drain
keeps jobs off it; its repair needs it empty).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState

HOLD_NAME = "gpufleet-gpu-hold"
"""The job name of every holder (with the comment's ``gpufleet:``, gpufleet's mark)."""

COMMENT_PREFIX = "gpufleet: "


def comment(node: str, index: int, fault: str) -> str:
    """The holder's comment: whose GPU, which one, why (for ``squeue -o %k`` readers)."""
    return f"{COMMENT_PREFIX}holds quarantined GPU {index} of {node} ({fault})"


@dataclass(frozen=True, slots=True)
class HoldJob:
    """One of gpufleet's holder jobs as Slurm shows it."""

    job_id: int
    node: str
    """The node it runs on, or is pinned to while pending."""
    running: bool
    gpus: tuple[int, ...] = ()
    """The GPU indexes Slurm allocated it (running jobs)."""
    comment: str = ""

    @property
    def ours(self) -> bool:
        return self.comment.startswith(COMMENT_PREFIX)


def wanted(record: NodeRecord | None, slurm_known: bool) -> frozenset[int]:
    """The GPU indexes to hold on a node: its record's quarantined GPUs while it is in
    production and Slurm knows it; none otherwise (no record, or the node left production:
    the drain keeps jobs off it, and the repair needs it empty)."""
    if record is None or not slurm_known or record.state is not NodeState.PRODUCTION:
        return frozenset()
    return frozenset(q.index for q in record.quarantined_gpus)


@dataclass(frozen=True, slots=True)
class HoldPlan:
    """What to do on one node: cancel these holders, acquire these GPUs (ascending)."""

    cancel: tuple[int, ...]
    acquire: tuple[int, ...]
    held: tuple[int, ...]


def plan(want: frozenset[int], jobs: Iterable[HoldJob]) -> HoldPlan:
    """Keep one running holder per wanted GPU; cancel every other holder of ours (pending
    ones, spacers left by an interrupted try, those of released GPUs, duplicates)."""
    held: dict[int, int] = {}
    cancel: list[int] = []
    for j in sorted(jobs, key=lambda j: j.job_id):
        if not j.ours:
            continue
        index = j.gpus[0] if j.running and len(j.gpus) == 1 else None
        if index is not None and index in want and index not in held:
            held[index] = j.job_id
        else:
            cancel.append(j.job_id)
    return HoldPlan(
        cancel=tuple(cancel),
        acquire=tuple(sorted(want - held.keys())),
        held=tuple(sorted(held)),
    )


class Landing(StrEnum):
    """Where a new holder landed, relative to the GPU it is meant to hold."""

    HELD = "held"
    """On the GPU: keep it."""
    SPACER = "spacer"
    """On a lower free GPU: keep it until the try ends, submit the next."""
    BUSY = "busy"
    """Above it, or not started: the GPU is in use; cancel the try, retry next pass."""


def landed(target: int, gpus: Sequence[int] | None) -> Landing:
    """What a holder's allocation (None: not running yet) means for ``target``."""
    if gpus is None or len(gpus) != 1:
        return Landing.BUSY
    if gpus[0] == target:
        return Landing.HELD
    return Landing.SPACER if gpus[0] < target else Landing.BUSY


_IDX = re.compile(r"\(IDX:([0-9,\-]+)\)")


def gpu_indexes(gres_detail: str) -> tuple[int, ...]:
    """``gpu:1(IDX:3)`` / ``gpu:2(IDX:0-1)`` / ``gpu:3(IDX:0,2-3)`` (``scontrol -d show job``'s
    ``GRES=``) -> the indexes; () when Slurm names none."""
    found: list[int] = []
    for m in _IDX.finditer(gres_detail):
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                return ()
            found.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(found)
