"""The checks by name, and what each passive one looks for.

Apart from :mod:`gpufleet.health.checks` (numpy, the monitors), so that a help text
that lists the checks (``gpufleet health check --help``) imports neither.
"""

from __future__ import annotations

from gpufleet.domain.faults import FaultKind, Subsystem

PASSIVE: dict[str, tuple[frozenset[FaultKind], Subsystem | None, str]] = {
    "gpu-xid": (frozenset({FaultKind.XID}), Subsystem.KERNEL, "no XID in the kernel log"),
    "gpu-memory": (
        frozenset(
            {
                FaultKind.ECC_UNCORRECTABLE,
                FaultKind.ROW_REMAP_PENDING,
                FaultKind.ROW_REMAP_FAILED,
                FaultKind.RETIRED_PAGES_LIMIT,
            }
        ),
        Subsystem.GPU,
        "no uncorrectable ECC, remap pending or failure",
    ),
    "gpu-count": (frozenset({FaultKind.GPU_MISSING}), Subsystem.GPU, "all GPUs visible"),
    "nvlink": (frozenset({FaultKind.NVLINK_DOWN}), Subsystem.NVLINK, "all NVLink links active"),
    "thermal": (
        frozenset({FaultKind.THERMAL_THROTTLE, FaultKind.POWER_THROTTLE}),
        Subsystem.THERMAL,
        "no thermal or power slowdown",
    ),
    "pcie": (frozenset({FaultKind.PCIE_DEGRADED}), Subsystem.PCIE, "PCIe links at full width"),
    "infiniband": (
        frozenset(
            {
                FaultKind.IB_PORT_DOWN,
                FaultKind.IB_LINK_FLAP,
                FaultKind.IB_RATE_DEGRADED,
                FaultKind.IB_SYMBOL_ERRORS,
            }
        ),
        Subsystem.INFINIBAND,
        "all HCA ports active at the expected rate",
    ),
    "kernel": (
        frozenset({FaultKind.KERNEL_SOFT_LOCKUP, FaultKind.KERNEL_HUNG_TASK}),
        Subsystem.KERNEL,
        "no soft lockup or hung task",
    ),
    "nvswitch": (
        frozenset({FaultKind.NVSWITCH_FATAL, FaultKind.NVSWITCH_NONFATAL}),
        Subsystem.KERNEL,
        "no NVSwitch SXid in the kernel log",
    ),
    "fabric": (
        frozenset(
            {FaultKind.FABRIC_NOT_READY, FaultKind.FABRIC_DEGRADED, FaultKind.IMEX_NOT_READY}
        ),
        Subsystem.FABRIC,
        "NVLink fabric registered and healthy; IMEX READY where the host runs it",
    ),
}
ACTIVE = ("gemm", "sdc", "hbm", "allreduce", "dcgm")
ALL = (*PASSIVE, *ACTIVE)
