"""One bad GPU, not eight: which faults take one GPU out instead of the node, and when.

A fault in one GPU's memory that the driver contained (NVIDIA's catalogue: the rest of
the node, and the other programs, were unaffected) leaves a GPU that must not take new
work until its reset applies the row remap, and seven GPUs that are fine. With
``spec.gpuQuarantine.enabled`` such a fault quarantines its GPU: the node stays in
production (the disruption budget counts it in service), no new work is placed on that
GPU (Slurm: a job gpufleet holds on it; Kubernetes: a DeviceTaintRule), and the work on
the other GPUs goes on. The repair (a reset, which needs the node empty, through the one
gate) comes later: after ``repairAfterSeconds`` the node drains letting its jobs finish,
through the budget, and the quarantine is released when verification passed.

Everything else takes the node, as before: a fault this module does not list, a fault
that names no GPU, a rule (or its repeats, or the lemon score) that asks for more than
the GPU's reset, a fault on a GPU already quarantined, and one GPU more than
``maxGpusPerNode``. Pure: :func:`choose` and :func:`repair_due` are the whole decision
(docs/decisions/0233).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpufleet.domain.faults import FaultEvent
from gpufleet.domain.ladder import Step
from gpufleet.domain.policy import GpuQuarantine
from gpufleet.domain.records import NodeRecord, QuarantinedGpu
from gpufleet.domain.states import NodeState

QUARANTINABLE: Mapping[str, str] = MappingProxyType(
    {
        "xid-94": "a contained memory error: NVIDIA's action is RESTART_APP (the error was "
        "kept to the program that used the memory; other work went on), the row remap it "
        "leaves applies at the GPU's reset",
        "xid-48": "a double-bit ECC error in this GPU's memory (WORKFLOW_XID_48: the driver "
        "contains it to the GPU, XID 94, or says it did not, XID 95); the reset applies the "
        "row remap",
        "xid-63": "a row remap (or page retirement) recorded in this GPU's memory, taking "
        "effect at its reset",
        "xid-156": "a resource retirement in this GPU, taking effect at its reset",
        "ecc-uncorrectable": "uncorrectable ECC errors counted in this GPU's memory; the reset "
        "applies the row remap",
        "row-remap-pending": "a row remap pending in this GPU's memory; it applies at the "
        "GPU's reset",
    }
)
"""Fault key -> why one GPU may go out alone (docs/faults.md, "GPU quarantine").

Chosen from NVIDIA's XID catalogue: memory errors of one GPU that the driver contained,
or that are only waiting for the GPU's reset. Not listed, on purpose: XID 95 (uncontained:
whatever the GPU touched, a peer over NVLink included, may hold bad data), XIDs 64 and
``row-remap-failed`` (no spare rows: NVIDIA's RMA criterion, the node goes for the part),
XID 79 (off the bus: a node reboot), the NVLink XIDs and faults (a link has a GPU at each
end), the GSP and timeout XIDs (the driver's state on the node is in doubt) and every
fault of the node itself."""

RELEASE_TEXT = "released: the repair was verified"


@dataclass(frozen=True, slots=True)
class Choice:
    """Quarantine one GPU (``gpu``) or take the node (``gpu`` None), and why."""

    gpu: QuarantinedGpu | None
    why: str


def choose(
    config: GpuQuarantine, record: NodeRecord, fault: FaultEvent, step: Step, now: float
) -> Choice:
    """Whether ``fault`` (whose rule asks for ``step``) quarantines its GPU on the node of
    ``record`` or takes the node. The quarantine is the milder answer; any doubt takes the
    node, as gpufleet did before quarantines existed."""
    key = fault.key
    if not config.enabled:
        return Choice(None, "gpuQuarantine is off: the node is taken")
    reason = QUARANTINABLE.get(key)
    if reason is None:
        return Choice(None, f"{key} does not allow quarantining one GPU: the node is taken")
    gpu = fault.evidence.gpu_index
    if gpu is None:
        return Choice(None, f"{key} names no GPU: the node is taken")
    if record.state is not NodeState.PRODUCTION:
        return Choice(None, f"the node is in {record.state}, not production: no quarantine")
    if step is not Step.GPU_RESET:
        return Choice(None, f"the repair asked for is {step}, more than a GPU reset: node taken")
    if any(q.index == gpu for q in record.quarantined_gpus):
        return Choice(None, f"GPU {gpu} is already quarantined and faulted again: node taken")
    if len(record.quarantined_gpus) >= config.max_gpus_per_node:
        n = len(record.quarantined_gpus)
        return Choice(
            None,
            f"{n} GPU(s) already quarantined, at most {config.max_gpus_per_node} per node: "
            "the node is taken",
        )
    return Choice(
        QuarantinedGpu(index=gpu, uuid="", fault=key, since=now),
        f"GPU {gpu} quarantined, the node keeps serving on its other GPUs: {reason}",
    )


def repair_due(config: GpuQuarantine, record: NodeRecord, now: float) -> bool:
    """Whether a node in production has kept a GPU quarantined long enough: it is taken out
    for the repair (drained letting its jobs finish, through the budget). A policy that
    turned quarantines off since takes it out at once: its GPUs would never come back."""
    if record.state is not NodeState.PRODUCTION or not record.quarantined_gpus:
        return False
    if not config.enabled:
        return True
    oldest = min(q.since for q in record.quarantined_gpus)
    return now - oldest >= config.repair_after_seconds


def describe(gpus: tuple[QuarantinedGpu, ...]) -> str:
    """``GPU 3 (xid-94), GPU 5 (row-remap-pending)``: for Events, reasons and explain."""
    return ", ".join(f"GPU {q.index} ({q.fault})" for q in gpus)


def indexes(record: NodeRecord) -> frozenset[int]:
    """The node's quarantined GPU indexes."""
    return frozenset(q.index for q in record.quarantined_gpus)


def explain(config: GpuQuarantine, key: str, steps: tuple[Step | None, ...]) -> str:
    """One line for ``gpufleet policy explain``: whether fault ``key``, whose rule asks for
    ``steps`` (one occurrence, its repeats), quarantines a GPU or takes the node."""
    reason = QUARANTINABLE.get(key)
    if reason is None:
        return f"the node, not one GPU: {key} does not allow quarantining one GPU"
    if Step.GPU_RESET not in steps:
        return f"no GPU quarantine: the rule for {key} never asks for a GPU reset"
    if not config.enabled:
        return f"the node: gpuQuarantine is off (on, {key} would quarantine its GPU: {reason})"
    return (
        f"its GPU, not the node, when the rule asks for a GPU reset and the fault names the GPU "
        f"(at most {config.max_gpus_per_node} per node; a repeat on that GPU, one GPU more or a "
        f"lemon takes the node; the repair drains the node after "
        f"{config.repair_after_seconds:g}s): {reason}"
    )
