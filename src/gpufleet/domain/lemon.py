"""Lemon scores: how much trouble a node, and each of its GPUs, has been lately.

A count of incidents in a window treats a GPU that fell off the bus like a
thermal throttle, and forgets everything the day the window slides past it.
A lemon score instead adds the *weight of the fault's class* (a GPU hardware
fault counts more than a link flap, an application XID counts nothing) and
lets every contribution *decay* with a half-life, so recent trouble counts
most and a node that stays healthy earns its way back.

Exponential decay makes the score one number per node and per GPU, updated
exactly: ``score(t) = score(t0) * 2 ** (-(t - t0) / half_life) + weight``.
:class:`LemonScore` keeps the value, the time it was computed and the
half-life it decays with, so anyone reading it later (the CLI, a dashboard)
can compute today's value without the policy.

What counts, and when the score sends a node to triage, is decided in
:mod:`gpufleet.domain.decide`; this module only classifies, weighs and decays.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpufleet.domain.bounds import MAX_SCORE
from gpufleet.domain.faults import FaultEvent, FaultKind
from gpufleet.domain.subsystems import Subsystem
from gpufleet.domain.xids import XIDS, XidClass

DAY = 86400.0
FORGET_BELOW = 0.01
"""A GPU whose score decayed below this is dropped from the record (bounded size)."""


class FaultClass(StrEnum):
    """What a fault says about the hardware it happened on (the weight's key)."""

    HARDWARE = "hardware"
    """The GPU, its memory or the switch failed: ECC, fallen off the bus, SDC, diag."""
    LINK = "link"
    """A cable, port or PCIe/NVLink/InfiniBand link: often the cable, sometimes the card."""
    PERFORMANCE = "performance"
    """Measured too slow (GEMM, HBM, NCCL, straggler): a weak part or a bad setting."""
    SOFTWARE = "software"
    """The host: kernel lockups, hung tasks, Slurm's own health checks draining it."""
    ENVIRONMENT = "environment"
    """Thermal or power throttling: the rack's cooling or power as much as the node."""
    INFORMATIONAL = "informational"
    """Worth a note (a pending row remap, a corrected switch error, a secondary XID)."""
    APPLICATION = "application"
    """The program's fault (an application XID): says nothing about the node."""


_KIND_CLASS: Mapping[FaultKind, FaultClass] = MappingProxyType(
    {
        FaultKind.ECC_UNCORRECTABLE: FaultClass.HARDWARE,
        FaultKind.ROW_REMAP_PENDING: FaultClass.INFORMATIONAL,
        FaultKind.ROW_REMAP_FAILED: FaultClass.HARDWARE,
        FaultKind.RETIRED_PAGES_LIMIT: FaultClass.HARDWARE,
        FaultKind.NVLINK_DOWN: FaultClass.LINK,
        FaultKind.IB_PORT_DOWN: FaultClass.LINK,
        FaultKind.IB_LINK_FLAP: FaultClass.LINK,
        FaultKind.IB_RATE_DEGRADED: FaultClass.LINK,
        FaultKind.IB_SYMBOL_ERRORS: FaultClass.LINK,
        FaultKind.PCIE_DEGRADED: FaultClass.LINK,
        FaultKind.GPU_MISSING: FaultClass.HARDWARE,
        FaultKind.THERMAL_THROTTLE: FaultClass.ENVIRONMENT,
        FaultKind.POWER_THROTTLE: FaultClass.ENVIRONMENT,
        FaultKind.KERNEL_SOFT_LOCKUP: FaultClass.SOFTWARE,
        FaultKind.KERNEL_HUNG_TASK: FaultClass.SOFTWARE,
        FaultKind.GEMM_BELOW_THRESHOLD: FaultClass.PERFORMANCE,
        FaultKind.HBM_BELOW_THRESHOLD: FaultClass.PERFORMANCE,
        FaultKind.NCCL_BELOW_THRESHOLD: FaultClass.PERFORMANCE,
        FaultKind.SDC_MISMATCH: FaultClass.HARDWARE,
        FaultKind.STRAGGLER: FaultClass.PERFORMANCE,
        FaultKind.DCGM_DIAG_FAILED: FaultClass.HARDWARE,
        FaultKind.SLURM_DRAIN: FaultClass.SOFTWARE,
        FaultKind.NVSWITCH_FATAL: FaultClass.HARDWARE,
        FaultKind.NVSWITCH_NONFATAL: FaultClass.INFORMATIONAL,
        FaultKind.FABRIC_NOT_READY: FaultClass.LINK,
        FaultKind.FABRIC_DEGRADED: FaultClass.LINK,
        FaultKind.IMEX_NOT_READY: FaultClass.SOFTWARE,
    }
)
"""The class of every fault kind but ``xid`` (XIDs are classed by the catalogue)."""

_LINK_SUBSYSTEMS = frozenset({Subsystem.NVLINK, Subsystem.PCIE, Subsystem.INFINIBAND})

_SUBSYSTEM_CLASS: Mapping[Subsystem, FaultClass] = MappingProxyType(
    {
        Subsystem.GPU: FaultClass.HARDWARE,
        Subsystem.NVSWITCH: FaultClass.HARDWARE,
        Subsystem.NVLINK: FaultClass.LINK,
        Subsystem.PCIE: FaultClass.LINK,
        Subsystem.INFINIBAND: FaultClass.LINK,
        Subsystem.PERFORMANCE: FaultClass.PERFORMANCE,
        Subsystem.KERNEL: FaultClass.SOFTWARE,
        Subsystem.SLURM: FaultClass.SOFTWARE,
        Subsystem.THERMAL: FaultClass.ENVIRONMENT,
    }
)
"""A fault kind missing from the table above counts by its subsystem (link otherwise)."""


def fault_class(fault: FaultEvent) -> FaultClass:
    """The class a fault counts in.

    XIDs follow the catalogue's class; a hardware XID of a link subsystem
    (NVLink, PCIe) counts as a link fault. An XID the catalogue does not know
    counts as informational: a policy may act on it, but its meaning is unknown.
    """
    if fault.xid is not None:
        info = XIDS.get(fault.xid)
        if info is None:
            return FaultClass.INFORMATIONAL
        if info.xid_class is XidClass.HARDWARE:
            return FaultClass.LINK if info.subsystem in _LINK_SUBSYSTEMS else FaultClass.HARDWARE
        if info.xid_class is XidClass.APPLICATION:
            return FaultClass.APPLICATION
        return FaultClass.INFORMATIONAL
    found = _KIND_CLASS.get(fault.kind)
    if found is not None:
        return found
    return _SUBSYSTEM_CLASS.get(fault.subsystem, FaultClass.LINK)


class LemonWeights(BaseModel):
    """How much one fault of each class adds to a score (``lemon.weights``)."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        allow_inf_nan=False,
        use_attribute_docstrings=True,  # descriptions in the FleetPolicy CRD
    )

    hardware: float = Field(default=1.0, ge=0, le=MAX_SCORE)
    """Added by a hardware fault (the GPU, its memory or the switch failed: ECC, fallen off the
    bus, SDC, diag). Default 1.0."""
    link: float = Field(default=0.5, ge=0, le=MAX_SCORE)
    """Added by a link fault (a cable, port or PCIe, NVLink or InfiniBand link). Default 0.5."""
    performance: float = Field(default=0.5, ge=0, le=MAX_SCORE)
    """Added by a performance fault (measured too slow: GEMM, HBM, NCCL, straggler). Default 0.5."""
    software: float = Field(default=0.5, ge=0, le=MAX_SCORE)
    """Added by a host software fault (kernel lockup, hung task, a Slurm health check's drain).
    Default 0.5."""
    environment: float = Field(default=0.1, ge=0, le=MAX_SCORE)
    """Added by thermal or power throttling (the rack's cooling or power as much as the node).
    Default 0.1."""
    informational: float = Field(default=0.1, ge=0, le=MAX_SCORE)
    """Added by a fault worth a note (a pending row remap, a corrected switch error, a secondary
    XID). Default 0.1."""
    application: float = Field(default=0.0, ge=0, le=MAX_SCORE)
    """Added by an application XID (the program's fault; says nothing about the node). Default 0."""

    def of(self, cls: FaultClass) -> float:
        """The weight of a class."""
        value: float = getattr(self, cls.value)
        return value


def decay(value: float, *, since: float, now: float, half_life: float) -> float:
    """``value`` computed at ``since``, decayed to ``now`` (never grows back in time)."""
    if now <= since or value == 0.0:
        return value
    factor: float = 0.5 ** ((now - since) / half_life)
    return value * factor


@dataclass(frozen=True, slots=True)
class LemonScore:
    """A node's score and its GPUs' (by scope, ``gpu3``), as of :attr:`at`."""

    node: float
    at: float
    half_life_seconds: float
    gpus: Mapping[str, float] = field(default_factory=dict)
    """Scores of the GPUs that have one (a plain dict: stored as JSON with the record)."""

    def now(self, now: float) -> LemonScore:
        """This score decayed to ``now`` (GPUs that decayed to nearly nothing dropped)."""
        hl = self.half_life_seconds
        gpus = {
            k: v2
            for k, v in self.gpus.items()
            if (v2 := decay(v, since=self.at, now=now, half_life=hl)) >= FORGET_BELOW
        }
        node = decay(self.node, since=self.at, now=now, half_life=hl)
        return LemonScore(node=node, at=max(now, self.at), half_life_seconds=hl, gpus=gpus)

    @property
    def worst_gpu(self) -> tuple[str, float] | None:
        """The GPU with the highest score, if any GPU has one."""
        if not self.gpus:
            return None
        return max(self.gpus.items(), key=lambda kv: (kv[1], kv[0]))


def add(
    score: LemonScore | None, *, weight: float, scope: str, now: float, half_life_seconds: float
) -> LemonScore:
    """``score`` after a fault of ``weight`` at ``now`` on component ``scope``.

    The old score decays with the half-life it was kept under up to ``now``;
    from then on it decays with ``half_life_seconds`` (a policy change applies
    forward, never rewrites the past). A GPU-scoped fault (``gpu3``) also adds
    to that GPU's score.
    """
    base = (score or LemonScore(node=0.0, at=now, half_life_seconds=half_life_seconds)).now(now)
    gpus = dict(base.gpus)
    if is_gpu(scope):
        gpus[scope] = gpus.get(scope, 0.0) + weight
    return LemonScore(
        node=base.node + weight,
        at=now,
        half_life_seconds=half_life_seconds,
        gpus=gpus,
    )


def is_gpu(scope: str) -> bool:
    """Whether a fault scope names one GPU (``gpu3``)."""
    return scope.startswith("gpu") and scope[3:].isdigit()


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a score makes the node a lemon, and the sentence that says why."""

    lemon: bool
    why: str


def judge(
    score: LemonScore | None, *, now: float, threshold: float, gpu_threshold: float
) -> Verdict:
    """A node is a lemon when its score, or any one GPU's, reaches its threshold."""
    if score is None:
        return Verdict(False, "lemon score 0")
    s = score.now(now)
    worst = s.worst_gpu
    if s.node >= threshold:
        return Verdict(True, f"lemon score {s.node:.2f} >= {threshold:g}")
    if worst is not None and worst[1] >= gpu_threshold:
        return Verdict(True, f"lemon score of {worst[0]} {worst[1]:.2f} >= {gpu_threshold:g}")
    return Verdict(False, f"lemon score {s.node:.2f} (threshold {threshold:g})")


def gpu_text(score: LemonScore) -> str:
    """The GPUs' scores, highest first: ``gpu3=1.90,gpu0=0.51`` ('' when none)."""
    ranked = sorted(score.gpus.items(), key=lambda kv: (-kv[1], kv[0]))
    return ",".join(f"{k}={v:.2f}" for k, v in ranked)
