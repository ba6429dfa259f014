"""NVML readings: the raw value set of one GPU, parsed and judged.

The real backend (:mod:`_nvml`) and the simulated backend both produce one
*raw value set* per GPU: a JSON-shaped dict whose keys name the NVML call it
came from and whose values are what NVML returned, or the NVML error name as
a string (``"NVML_ERROR_NOT_SUPPORTED"``) when the call failed. Parsing is
strict about types: a value of the wrong shape becomes ``None`` ("unknown")
and is listed in :attr:`GpuReading.unknown`, never a fault.

Keys (all optional except ``index``)::

    index, name, uuid, pci_bus_id                       nvmlDeviceGet{Index,Name,UUID,PciInfo}
    memory_total_bytes                                   nvmlDeviceGetMemoryInfo().total
                                                        (published as DRA capacity only)
    ecc_uncorrected_volatile, ecc_uncorrected_aggregate  nvmlDeviceGetTotalEccErrors
    ecc_corrected_volatile
    remapped_rows: [correctable, uncorrectable, pending, failure]
                                                        nvmlDeviceGetRemappedRows
    retired_pages_sbe, retired_pages_dbe, retired_pages_pending
                                                        nvmlDeviceGetRetiredPages(_PendingStatus)
    clocks_event_reasons                                 nvmlDeviceGetCurrentClocksEventReasons
    temperature_c                                        nvmlDeviceGetTemperature(GPU)
    power_mw, power_limit_mw                             nvmlDeviceGetPowerUsage / EnforcedPowerLimit
    pcie_gen, pcie_gen_max, pcie_width, pcie_width_max   nvmlDeviceGet{Curr,Max}PcieLink{Generation,Width}
    nvlink_state: [1, 1, 0, ...]                         nvmlDeviceGetNvLinkState per link
"""  # noqa: E501

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.profiles import SkuProfile

# nvmlClocksEventReason* bits (nvml.h).
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THERMAL_BITS = SW_THERMAL | HW_THERMAL
POWER_BITS = HW_SLOWDOWN | HW_POWER_BRAKE
"""HW slowdown and power brake mean the board or the PSU pulled the clocks
down; the SW power cap is normal under load and is not a fault."""

_INT_KEYS = (
    "ecc_uncorrected_volatile",
    "ecc_uncorrected_aggregate",
    "ecc_corrected_volatile",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "clocks_event_reasons",
    "pcie_gen",
    "pcie_gen_max",
    "pcie_width",
    "pcie_width_max",
)
_NUM_KEYS = ("temperature_c", "power_mw", "power_limit_mw")
NOT_SUPPORTED = "NVML_ERROR_NOT_SUPPORTED"
"""The one NVML error that means "this GPU has no such feature" rather than a failure."""
GPU_IS_LOST = "NVML_ERROR_GPU_IS_LOST"


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU's NVML values; ``None`` means unknown."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    ints: dict[str, int] = field(default_factory=dict)
    nums: dict[str, float] = field(default_factory=dict)
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    remapped_uncorrectable: int | None = None
    retired_pending: bool | None = None
    nvlink_state: tuple[bool, ...] | None = None
    unknown: tuple[str, ...] = ()
    """Keys that were present but unreadable (an NVML error or a bad value)."""
    unreadable: tuple[str, ...] = ()
    """The subset of :attr:`unknown` that is a failure, not an absent feature:
    every NVML error but ``NVML_ERROR_NOT_SUPPORTED``, and values of the wrong
    shape. Their subsystem is unknown, never healthy (fail closed)."""
    lost: bool = False
    """NVML reports the GPU lost (``NVML_ERROR_GPU_IS_LOST``): it counts as missing."""

    def get(self, key: str) -> int | None:
        """An integer value, or None when unknown."""
        return self.ints.get(key)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and (value != value or value < 0 or not value.is_integer()):
        return None
    return int(value) if value >= 0 else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value else None


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    return None


def parse_gpu(raw: dict[str, Any]) -> GpuReading | None:
    """Parse one raw value set; None when even the GPU index is unreadable."""
    index = _int(raw.get("index"))
    if index is None:
        return None
    unknown: list[str] = []
    ints: dict[str, int] = {}
    nums: dict[str, float] = {}
    for key in _INT_KEYS:
        if key in raw:
            v = _int(raw[key])
            if v is None:
                unknown.append(key)
            else:
                ints[key] = v
    for key in _NUM_KEYS:
        if key in raw:
            n = _num(raw[key])
            if n is None:
                unknown.append(key)
            else:
                nums[key] = n
    pending = failure = None
    unc_rows = None
    rows = raw.get("remapped_rows")
    if rows is not None:
        if isinstance(rows, list | tuple) and len(rows) == 4:
            unc_rows = _int(rows[1])
            pending, failure = _flag(rows[2]), _flag(rows[3])
        if pending is None or failure is None:
            unknown.append("remapped_rows")
            pending = failure = None
    retired_pending = None
    if "retired_pages_pending" in raw:
        retired_pending = _flag(raw["retired_pages_pending"])
        if retired_pending is None:
            unknown.append("retired_pages_pending")
    links: tuple[bool, ...] | None = None
    if "nvlink_state" in raw:
        states = raw["nvlink_state"]
        parsed = [_flag(s) for s in states] if isinstance(states, list) else [None]
        if all(p is not None for p in parsed):
            links = tuple(bool(p) for p in parsed)
        else:
            unknown.append("nvlink_state")

    def text(key: str) -> str | None:
        v = raw.get(key)
        return v if isinstance(v, str) and not v.startswith("NVML_ERROR") else None

    unreadable = tuple(k for k in unknown if raw.get(k) != NOT_SUPPORTED)
    name = raw.get("name")
    if isinstance(name, str) and name.startswith("NVML_ERROR"):
        unreadable = ("handle", *unreadable)
    lost = any(v == GPU_IS_LOST for v in raw.values())
    return GpuReading(
        index=index,
        name=text("name"),
        uuid=text("uuid"),
        pci_bus_id=text("pci_bus_id"),
        ints=ints,
        nums=nums,
        remap_pending=pending,
        remap_failure=failure,
        remapped_uncorrectable=unc_rows,
        retired_pending=retired_pending,
        nvlink_state=links,
        unknown=tuple(unknown),
        unreadable=unreadable,
        lost=lost,
    )


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:3B:00.0`` / ``0000:3b:00`` → ``0000:3b:00`` (domain:bus:device)."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        domain, bus, dev = parts
        return f"{int(domain, 16):04x}:{bus}:{dev.split('.')[0]}"
    return text


def gpu_faults(g: GpuReading, profile: SkuProfile, *, node: str, now: float) -> list[FaultEvent]:
    """The faults one GPU's values show. Unknown values never become faults."""
    out: list[FaultEvent] = []

    def add(kind: FaultKind, message: str, **counters: float) -> None:
        ev = Evidence(
            gpu_index=g.index, pci_bus_id=g.pci_bus_id, counters=counters, message=message
        )
        out.append(FaultEvent(kind, node, now, evidence=ev))

    dbe = g.get("ecc_uncorrected_volatile")
    if dbe:
        add(
            FaultKind.ECC_UNCORRECTABLE,
            "uncorrectable ECC errors since the last reset",
            ecc_uncorrected_volatile=dbe,
        )
    if g.remap_failure:
        add(FaultKind.ROW_REMAP_FAILED, "row remapping failed (no spare rows)")
    if g.remap_pending:
        add(
            FaultKind.ROW_REMAP_PENDING,
            "row remap pending; needs a GPU reset",
            remapped_rows_uncorrectable=float(g.remapped_uncorrectable or 0),
        )
    retired = (g.get("retired_pages_sbe") or 0) + (g.get("retired_pages_dbe") or 0)
    if retired >= profile.retired_pages_max:
        add(
            FaultKind.RETIRED_PAGES_LIMIT,
            f"{retired} retired pages",
            retired_pages=retired,
            limit=profile.retired_pages_max,
        )
    reasons = g.get("clocks_event_reasons")
    temp = g.nums.get("temperature_c")
    if reasons is not None and reasons & THERMAL_BITS:
        add(
            FaultKind.THERMAL_THROTTLE,
            f"clocks event reasons 0x{reasons:x} (thermal slowdown)",
            clocks_event_reasons=reasons,
            **({"temperature_c": temp} if temp is not None else {}),
        )
    elif temp is not None and temp > profile.max_temperature_c:
        add(
            FaultKind.THERMAL_THROTTLE,
            f"temperature {temp:g} C above {profile.max_temperature_c:g} C",
            temperature_c=temp,
        )
    if reasons is not None and reasons & POWER_BITS:
        power = g.nums.get("power_mw")
        add(
            FaultKind.POWER_THROTTLE,
            f"clocks event reasons 0x{reasons:x} (HW slowdown / power brake)",
            clocks_event_reasons=reasons,
            **({"power_w": power / 1000} if power is not None else {}),
        )
    width, width_max = g.get("pcie_width"), g.get("pcie_width_max")
    gen, gen_max = g.get("pcie_gen"), g.get("pcie_gen_max")
    idle = reasons is None or bool(reasons & GPU_IDLE)
    if width and width_max and width < width_max:
        add(
            FaultKind.PCIE_DEGRADED,
            f"PCIe link x{width} of x{width_max}",
            pcie_width=width,
            pcie_width_max=width_max,
        )
    elif gen and gen_max and gen < gen_max and not idle:
        # An idle GPU lowers its link speed to save power; only a busy one is judged.
        add(
            FaultKind.PCIE_DEGRADED,
            f"PCIe link Gen{gen} of Gen{gen_max} while busy",
            pcie_gen=gen,
            pcie_gen_max=gen_max,
        )
    if g.nvlink_state is not None and profile.nvlinks_per_gpu:
        active = sum(g.nvlink_state)
        down = [i for i, up in enumerate(g.nvlink_state) if not up]
        if active < profile.nvlinks_per_gpu or down:
            if g.nvlink_state:
                why = f"down: {','.join(str(i) for i in down) or '-'}"
            else:  # every link query NOT_SUPPORTED (seen on an H100 passed through alone)
                why = "NVML reports no NVLink on this GPU"
            add(
                FaultKind.NVLINK_DOWN,
                f"{active} of {profile.nvlinks_per_gpu} NVLink links active ({why})",
                nvlink_active=active,
                nvlink_expected=profile.nvlinks_per_gpu,
            )
    return out
