"""NVIDIA XID catalogue: meaning, NVIDIA's recommended action, our class.

Source: NVIDIA, "Analyzing Xid Errors with the Xid Catalog", column
"Resolution Bucket (Immediate Action)",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (and its
spreadsheet https://docs.nvidia.com/Xid-Catalog.xlsx). The page prints no
version; this module follows the edition that lists XIDs 1-172 and decodes
XIDs 144-150 for drivers before and from R575 (read 2026-11). Fleet practice
is summarised in docs/faults.md. Each entry also says which ladder rung the
default policy starts at (``None``: no node action). XIDs 144-150 get their
action per message (:mod:`gpufleet.domain.nvlink5`); ``start_at`` is the rung
for a message that needs a reset.

A policy may name any positive XID: one missing here is valid (with a
warning) and is treated as ``unknownXid`` says.

Classes:

* ``application`` — caused by the program (bad address, illegal class);
  the GPU stays usable. Alone, these never take a node out.
* ``hardware`` — the GPU, its memory or its links need a reset, a reboot or
  the vendor.
* ``secondary`` — a consequence of an earlier error; act on that one.
* ``informational`` — worth logging (and counting for lemon detection).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from gpufleet.domain.ladder import Step
from gpufleet.domain.subsystems import Subsystem


class NvidiaAction(StrEnum):
    """NVIDIA's "Resolution Bucket (Immediate Action)"."""

    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"
    IGNORE = "IGNORE"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    WORKFLOW_XID_45 = "WORKFLOW_XID_45"
    WORKFLOW_XID_48 = "WORKFLOW_XID_48"
    WORKFLOW_NVLINK_ERR = "WORKFLOW_NVLINK_ERR"
    WORKFLOW_NVLINK5_ERR = "WORKFLOW_NVLINK5_ERR"
    XID_154 = "XID_154"


class XidClass(StrEnum):
    """Who is at fault for an XID, which decides whether the node is."""

    APPLICATION = "application"
    HARDWARE = "hardware"
    SECONDARY = "secondary"
    INFORMATIONAL = "informational"


@dataclass(frozen=True, slots=True)
class XidInfo:
    """One catalogue entry."""

    code: int
    mnemonic: str
    meaning: str
    nvidia_action: NvidiaAction
    xid_class: XidClass
    start_at: Step | None
    """First rung of the ladder under the default policy; None = no node action."""
    subsystem: Subsystem = Subsystem.GPU
    note: str = ""


_NVLINK5_NOTE = (
    "the action depends on the sub-unit and error status in the message "
    "(NVIDIA's XID 144-150 decode): many are ignored, fatal ones reset the GPU"
)

A, H, SEC, INF = XidClass.APPLICATION, XidClass.HARDWARE, XidClass.SECONDARY, XidClass.INFORMATIONAL
N = NvidiaAction

_ENTRIES = (
    XidInfo(
        8,
        "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT",
        "GPU stopped processing (idle timeout)",
        N.RESTART_APP,
        A,
        None,
        note="job restart; repeats on one GPU suggest hardware",
    ),
    XidInfo(
        13,
        "ROBUST_CHANNEL_GR_EXCEPTION",
        "Graphics engine exception",
        N.RESTART_APP,
        A,
        None,
        note="usually a program bug; repeated on the same GPU it points at hardware",
    ),
    XidInfo(
        31,
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
        "GPU memory page fault",
        N.RESTART_APP,
        A,
        None,
        note="usually an illegal address in the program",
    ),
    XidInfo(
        43,
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "GPU stopped processing",
        N.IGNORE,
        A,
        None,
        note="the program's channel was reset; the GPU is fine",
    ),
    XidInfo(
        45,
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "Preemptive cleanup after previous errors",
        N.WORKFLOW_XID_45,
        SEC,
        None,
        note="act on the XID that preceded it",
    ),
    XidInfo(
        46,
        "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR",
        "GPU stopped processing (timeout)",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
    ),
    XidInfo(
        48,
        "ROBUST_CHANNEL_GPU_ECC_DBE",
        "Double-bit (uncorrectable) ECC error",
        N.WORKFLOW_XID_48,
        H,
        Step.GPU_RESET,
        note="a reset applies the row remap; a failed remap means RMA",
    ),
    XidInfo(
        32,
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "Invalid or corrupted push buffer stream",
        N.RESTART_APP,
        A,
        None,
        note="often PCIe quality; repeats on one GPU suggest the link",
    ),
    XidInfo(
        61,
        "PMU_BREAKPOINT",
        "Internal micro-controller breakpoint (unused on Ampere and newer)",
        N.CONTACT_SUPPORT,
        INF,
        None,
        note="NVIDIA lists it as unused on A100 and newer: contact support; newer "
        "drivers report a micro-controller halt as XID 62",
    ),
    XidInfo(62, "PMU_HALT_ERROR", "Internal micro-controller halt", N.RESET_GPU, H, Step.GPU_RESET),
    XidInfo(
        63,
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "Row-remap or page-retirement event recorded",
        N.IGNORE,
        INF,
        None,
        note="the remap takes effect at the next reset; lemon signal",
    ),
    XidInfo(
        64,
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "Row-remap or page-retirement failure",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
        note="then RMA under the row-remapping policy",
    ),
    XidInfo(
        68,
        "ROBUST_CHANNEL_NVDEC0_ERROR",
        "Video decoder (NVDEC0) exception",
        N.RESTART_APP,
        A,
        None,
    ),
    XidInfo(
        69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics engine class error", N.RESTART_APP, A, None
    ),
    XidInfo(
        74,
        "NVLINK_ERROR",
        "NVLink error",
        N.WORKFLOW_NVLINK_ERR,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
        note="persistent: baseboard RMA",
    ),
    XidInfo(
        79,
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus",
        N.RESTART_BM,
        H,
        Step.REBOOT,
        note="often with PCIe errors; repeats mean mechanical check or RMA",
    ),
    XidInfo(
        92,
        "EXCESSIVE_SBE_INTERRUPTS",
        "High single-bit ECC error rate",
        N.IGNORE,
        INF,
        None,
        note="monitor; lemon signal",
    ),
    XidInfo(
        94,
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "Contained memory error",
        N.RESTART_APP,
        A,
        None,
        note="containment let other work go on; the remap needs a later reset",
    ),
    XidInfo(
        95,
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "Uncontained memory error",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
    ),
    XidInfo(
        109,
        "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR",
        "Context-switch timeout",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
    ),
    XidInfo(
        110,
        "SEC_FAULT_ERROR",
        "Security fault",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
        note="NVIDIA: uncommon unless hardware failed; revert recent hardware changes "
        "and cold-reset the system",
    ),
    XidInfo(
        119,
        "GSP_RPC_TIMEOUT",
        "GSP (GPU System Processor) RPC timeout",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
        note="in practice often needs a node reboot",
    ),
    XidInfo(120, "GSP_ERROR", "GSP (GPU System Processor) error", N.RESET_GPU, H, Step.GPU_RESET),
    XidInfo(
        121,
        "C2C_ERROR",
        "C2C (chip-to-chip) link error",
        N.IGNORE,
        INF,
        None,
        note="Grace Hopper; corrected errors are logged",
    ),
    XidInfo(
        136,
        "ALI_TRAINING_FAIL",
        "NVLink link training failed",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
    ),
    XidInfo(
        140,
        "UNRECOVERABLE_ECC_ERROR_ESCAPE",
        "Unrecovered ECC error",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
    ),
    XidInfo(
        143,
        "GPU_INIT_ERROR",
        "GPU initialisation error",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
        note="repeats mean RMA",
    ),
    XidInfo(
        144,
        "NVLINK_SAW_ERROR",
        "NVLink5 SAW error",
        N.WORKFLOW_NVLINK5_ERR,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
        note=_NVLINK5_NOTE,
    ),
    XidInfo(
        145,
        "NVLINK_RLW_ERROR",
        "NVLink5 RLW error",
        N.WORKFLOW_NVLINK5_ERR,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
        note=_NVLINK5_NOTE,
    ),
    XidInfo(
        146,
        "NVLINK_TLW_ERROR",
        "NVLink5 TLW error",
        N.WORKFLOW_NVLINK5_ERR,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
        note=_NVLINK5_NOTE,
    ),
    XidInfo(
        147,
        "NVLINK_TREX_ERROR",
        "NVLink5 TREX error",
        N.WORKFLOW_NVLINK5_ERR,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
        note=_NVLINK5_NOTE,
    ),
    XidInfo(
        148,
        "NVLINK_NVLPW_CTRL_ERROR",
        "NVLink5 NVLPW_CTRL error",
        N.WORKFLOW_NVLINK5_ERR,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
        note=_NVLINK5_NOTE,
    ),
    XidInfo(
        149,
        "NVLINK_NETIR_ERROR",
        "NVLink5 NETIR error (link events)",
        N.WORKFLOW_NVLINK5_ERR,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
        note=_NVLINK5_NOTE,
    ),
    XidInfo(
        150,
        "NVLINK_MSE_ERROR",
        "NVLink5 MSE (management firmware) error",
        N.WORKFLOW_NVLINK5_ERR,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
        note=_NVLINK5_NOTE,
    ),
    XidInfo(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "GPU recovery action changed",
        N.XID_154,
        H,
        Step.GPU_RESET,
        note="do what the message asks: GPU reset, node reboot, or drain and reset",
    ),
    XidInfo(
        155,
        "NVLINK_SW_DEFINED_ERROR",
        "NVLink link down flagged as intentional (software defined)",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
        subsystem=Subsystem.NVLINK,
        note="investigate software or users if unexpected",
    ),
    XidInfo(
        156,
        "RESOURCE_RETIREMENT_EVENT",
        "Resource retirement event",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
        note="the retirement takes effect at the reset",
    ),
    XidInfo(
        157,
        "RESOURCE_RETIREMENT_FAILURE",
        "Resource retirement failure",
        N.IGNORE,
        INF,
        None,
        note="no repair possible (no spare resources); workloads may run and see the "
        "XID again; lemon signal",
    ),
    XidInfo(
        158,
        "GPU_FATAL_TIMEOUT",
        "GPU fatal timeout",
        N.RESET_GPU,
        H,
        Step.GPU_RESET,
        note="repeats mean contact support",
    ),
)

XIDS: Mapping[int, XidInfo] = MappingProxyType({e.code: e for e in _ENTRIES})
"""The catalogue, by XID number."""

MAX_XID = 65535
"""The largest XID number accepted anywhere (driver XIDs are below 200 today; the
bound keeps a typo such as 1450000 from validating)."""

XID_154_ACTIONS: Mapping[str, Step] = MappingProxyType(
    {
        "gpu-reset": Step.GPU_RESET,
        "drain-and-reset": Step.GPU_RESET,
        "drain-p2p": Step.GPU_RESET,
        "node-reboot": Step.REBOOT,
        "system-reboot": Step.REBOOT,
        "bus-reset": Step.REBOOT,
    }
)
"""XID 154 carries the recovery action the driver wants; this maps it to a rung."""
