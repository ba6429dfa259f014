"""The fault catalogue: what can go wrong on a GPU node, and its evidence.

A :class:`FaultEvent` is what a monitor or an active check reports. It names
the kind of fault, the node, the time and the evidence an operator needs to
act (GPU index and PCI bus id, HCA and port, counter values, the raw message).
XIDs are one kind among many; their meanings live in :mod:`xids`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from gpufleet.domain.subsystems import Subsystem as Subsystem  # re-exported: callers name it here
from gpufleet.domain.xids import XIDS


class FaultKind(StrEnum):
    """Every fault gpufleet knows. ``xid`` is refined by the XID number."""

    XID = "xid"
    ECC_UNCORRECTABLE = "ecc-uncorrectable"
    ROW_REMAP_PENDING = "row-remap-pending"
    ROW_REMAP_FAILED = "row-remap-failed"
    RETIRED_PAGES_LIMIT = "retired-pages-limit"
    NVLINK_DOWN = "nvlink-down"
    IB_PORT_DOWN = "ib-port-down"
    IB_LINK_FLAP = "ib-link-flap"
    IB_RATE_DEGRADED = "ib-rate-degraded"
    IB_SYMBOL_ERRORS = "ib-symbol-errors"
    PCIE_DEGRADED = "pcie-degraded"
    GPU_MISSING = "gpu-missing"
    THERMAL_THROTTLE = "thermal-throttle"
    POWER_THROTTLE = "power-throttle"
    KERNEL_SOFT_LOCKUP = "kernel-soft-lockup"
    KERNEL_HUNG_TASK = "kernel-hung-task"
    GEMM_BELOW_THRESHOLD = "gemm-below-threshold"
    HBM_BELOW_THRESHOLD = "hbm-below-threshold"
    NCCL_BELOW_THRESHOLD = "nccl-below-threshold"
    SDC_MISMATCH = "sdc-mismatch"
    STRAGGLER = "straggler"
    DCGM_DIAG_FAILED = "dcgm-diag-failed"
    NVSWITCH_FATAL = "nvswitch-fatal"
    NVSWITCH_NONFATAL = "nvswitch-nonfatal"
    FABRIC_NOT_READY = "fabric-not-ready"
    FABRIC_DEGRADED = "fabric-degraded"
    IMEX_NOT_READY = "imex-not-ready"
    SLURM_DRAIN = "slurm-drain"


@dataclass(frozen=True, slots=True)
class FaultInfo:
    """What a (non-XID) fault kind means and which subsystem it belongs to."""

    kind: FaultKind
    subsystem: Subsystem
    meaning: str


_INFO = (
    FaultInfo(FaultKind.XID, Subsystem.GPU, "NVIDIA driver error report (meaning per XID)"),
    FaultInfo(
        FaultKind.ECC_UNCORRECTABLE,
        Subsystem.GPU,
        "uncorrectable (double-bit) ECC errors in GPU memory; data was lost",
    ),
    FaultInfo(
        FaultKind.ROW_REMAP_PENDING,
        Subsystem.GPU,
        "a memory row is marked for remapping; it takes effect at the next GPU reset",
    ),
    FaultInfo(
        FaultKind.ROW_REMAP_FAILED,
        Subsystem.GPU,
        "row remapping failed (no spare rows); NVIDIA's RMA criterion",
    ),
    FaultInfo(
        FaultKind.RETIRED_PAGES_LIMIT,
        Subsystem.GPU,
        "retired pages reached the limit (pre-Ampere page retirement)",
    ),
    FaultInfo(FaultKind.NVLINK_DOWN, Subsystem.NVLINK, "an NVLink link is inactive"),
    FaultInfo(FaultKind.IB_PORT_DOWN, Subsystem.INFINIBAND, "an InfiniBand port is not ACTIVE"),
    FaultInfo(
        FaultKind.IB_LINK_FLAP,
        Subsystem.INFINIBAND,
        "an InfiniBand link went down and up again (link_downed counter rose)",
    ),
    FaultInfo(
        FaultKind.IB_RATE_DEGRADED,
        Subsystem.INFINIBAND,
        "an InfiniBand port runs below its expected rate",
    ),
    FaultInfo(
        FaultKind.IB_SYMBOL_ERRORS,
        Subsystem.INFINIBAND,
        "the symbol-error rate of an InfiniBand port is above threshold",
    ),
    FaultInfo(
        FaultKind.PCIE_DEGRADED,
        Subsystem.PCIE,
        "a GPU or HCA PCIe link trained below its maximum width or speed",
    ),
    FaultInfo(FaultKind.GPU_MISSING, Subsystem.GPU, "fewer GPUs are visible than expected"),
    FaultInfo(FaultKind.THERMAL_THROTTLE, Subsystem.THERMAL, "clocks are reduced for temperature"),
    FaultInfo(
        FaultKind.POWER_THROTTLE,
        Subsystem.THERMAL,
        "clocks are reduced by a hardware power brake or slowdown",
    ),
    FaultInfo(
        FaultKind.KERNEL_SOFT_LOCKUP,
        Subsystem.KERNEL,
        "the kernel watchdog saw a CPU stuck (soft lockup)",
    ),
    FaultInfo(
        FaultKind.KERNEL_HUNG_TASK,
        Subsystem.KERNEL,
        "a task was blocked for longer than the hung-task timeout",
    ),
    FaultInfo(
        FaultKind.GEMM_BELOW_THRESHOLD,
        Subsystem.PERFORMANCE,
        "GEMM throughput of a GPU is below the SKU profile threshold",
    ),
    FaultInfo(
        FaultKind.HBM_BELOW_THRESHOLD,
        Subsystem.PERFORMANCE,
        "HBM bandwidth of a GPU is below the SKU profile threshold",
    ),
    FaultInfo(
        FaultKind.NCCL_BELOW_THRESHOLD,
        Subsystem.PERFORMANCE,
        "all-reduce bus bandwidth is below the SKU profile threshold",
    ),
    FaultInfo(
        FaultKind.SDC_MISMATCH,
        Subsystem.GPU,
        "a GPU computed a different result from its peers (silent data corruption)",
    ),
    FaultInfo(
        FaultKind.STRAGGLER,
        Subsystem.PERFORMANCE,
        "the node is consistently slower than its peers in the same job",
    ),
    FaultInfo(FaultKind.DCGM_DIAG_FAILED, Subsystem.GPU, "a DCGM diagnostic test failed"),
    FaultInfo(
        FaultKind.NVSWITCH_FATAL,
        Subsystem.NVSWITCH,
        "the NVSwitch driver logged a fatal SXid: NVLink traffic through the switch stalls "
        "until the GPUs and switches are reset",
    ),
    FaultInfo(
        FaultKind.NVSWITCH_NONFATAL,
        Subsystem.NVSWITCH,
        "the NVSwitch driver logged a non-fatal SXid (corrected or contained)",
    ),
    FaultInfo(
        FaultKind.FABRIC_NOT_READY,
        Subsystem.FABRIC,
        "a GPU is not registered with the NVLink fabric (Fabric Manager not done, or "
        "registration failed): CUDA cannot start on it",
    ),
    FaultInfo(
        FaultKind.FABRIC_DEGRADED,
        Subsystem.FABRIC,
        "the NVLink fabric reports a GPU unhealthy or with degraded bandwidth",
    ),
    FaultInfo(
        FaultKind.IMEX_NOT_READY,
        Subsystem.FABRIC,
        "the host's IMEX daemon does not answer READY (multi-node NVLink memory sharing "
        "is unavailable)",
    ),
    FaultInfo(
        FaultKind.SLURM_DRAIN,
        Subsystem.SLURM,
        "Slurm drained the node for a reason the policy's slurm.reasons call hardware "
        "(LBNL NHC, a gpufleet health check, a failed prolog or epilog, Kill task failed)",
    ),
)

FAULTS: Mapping[FaultKind, FaultInfo] = MappingProxyType({i.kind: i for i in _INFO})
"""Meaning and subsystem of every fault kind."""


_NO_COUNTERS: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Evidence:
    """What an operator needs to see to believe and act on a fault."""

    gpu_index: int | None = None
    pci_bus_id: str | None = None
    hca: str | None = None
    port: int | None = None
    counters: Mapping[str, float] = field(default_factory=lambda: _NO_COUNTERS)
    message: str = ""
    """The raw line or a one-line summary (e.g. the kmsg line of an XID)."""
    recovery_action: str | None = None
    """For XID 154: the action the driver asks for (``gpu-reset``,
    ``node-reboot``, ``drain-and-reset``, ``drain-p2p``)."""
    gpu_instance: int | None = None
    """MIG: the GPU instance the driver attributed the error to (``GPU-I``); the
    physical GPU is ``gpu_index``, which remediation acts on."""
    compute_instance: int | None = None
    """MIG: the compute instance inside ``gpu_instance`` (``GPU-CI``)."""
    switch: str | None = None
    """An NVSwitch, as the driver names it (``nvidia-nvswitch3``)."""

    def scope(self) -> str:
        """A stable id of the component involved, used to count repeats (MIG
        instances count on their physical GPU: the GPU is what gets reset)."""
        if self.gpu_index is not None:
            return f"gpu{self.gpu_index}"
        if self.switch is not None:
            return self.switch
        if self.hca is not None:
            return f"{self.hca}/{self.port if self.port is not None else '*'}"
        return "node"

    def summary(self) -> str:
        """One human-readable line: component, counters and message."""
        parts: list[str] = []
        if self.gpu_index is not None:
            parts.append(f"GPU {self.gpu_index}")
        if self.gpu_instance is not None:
            mig = f"MIG GPU instance {self.gpu_instance}"
            if self.compute_instance is not None:
                mig += f" compute instance {self.compute_instance}"
            parts.append(mig)
        if self.switch is not None:
            parts.append(f"NVSwitch {self.switch}")
        if self.pci_bus_id:
            parts.append(f"PCI {self.pci_bus_id}")
        if self.hca is not None:
            parts.append(
                f"HCA {self.hca}" + (f" port {self.port}" if self.port is not None else "")
            )
        parts.extend(f"{k}={v:g}" for k, v in sorted(self.counters.items()))
        if self.message:
            parts.append(self.message)
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """One observed fault on one node."""

    kind: FaultKind
    node: str
    at: float
    xid: int | None = None
    evidence: Evidence = field(default_factory=Evidence)

    def __post_init__(self) -> None:
        if (self.kind is FaultKind.XID) != (self.xid is not None):
            raise ValueError("an XID number is required for kind 'xid' and only for it")
        if self.xid is not None and self.xid <= 0:
            raise ValueError(f"XID numbers are positive, not {self.xid}")

    @property
    def key(self) -> str:
        """The policy key of this fault: ``xid-79`` or the kind's name."""
        return f"xid-{self.xid}" if self.xid is not None else self.kind.value

    @property
    def subsystem(self) -> Subsystem:
        """The subsystem (and so the Node condition) this fault belongs to."""
        if self.xid is not None:
            info = XIDS.get(self.xid)
            return info.subsystem if info else Subsystem.GPU
        return FAULTS[self.kind].subsystem

    def describe(self) -> str:
        """Short text for Events, drain reasons and logs, e.g. ``xid79 GPU 3``."""
        name = f"xid{self.xid}" if self.xid is not None else self.kind.value
        where = self.evidence.scope()
        return name if where == "node" else f"{name} {where}"


def fault_key(kind: FaultKind, xid: int | None = None) -> str:
    """The policy key for a kind (and XID), as used in policy files."""
    return f"xid-{xid}" if kind is FaultKind.XID else kind.value
