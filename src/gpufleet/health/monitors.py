"""Passive monitors: read the hardware, turn what they see into faults.

:class:`PassiveMonitors` is polled by the agent (every second by default).
Each poll reads NVML, the kernel log and sysfs once and returns one
:class:`~gpufleet.domain.debounce.Observation` per subsystem: *state* faults
(present right now: remap pending, port down, link degraded) and *instant*
faults (logged since the last poll: XIDs, lockups, link flaps, symbol-error
bursts). A source that cannot be read makes its subsystems unreadable
(condition ``Unknown``) instead of healthy or faulty.

Counters (``link_downed``, ``symbol_error``) are judged by their increase
between polls; the first poll only records a baseline, and a counter that
went *down* (HCA reset, counter cleared) is a new baseline, not a fault.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.domain.debounce import Observation
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind, Subsystem
from gpufleet.domain.profiles import SkuProfile
from gpufleet.domain.subsystems import AGENT_SUBSYSTEMS
from gpufleet.health import fabric, ib_neighbours, kmsg, nvml_values, sysfs
from gpufleet.health.hardware import Hardware, HardwareError, NoGpuFound

log = logging.getLogger(__name__)

GPU_SUBSYSTEMS = (
    Subsystem.GPU,
    Subsystem.NVLINK,
    Subsystem.THERMAL,
    Subsystem.PCIE,
    Subsystem.FABRIC,
)
INSTANT_KINDS = frozenset(
    {
        FaultKind.XID,
        FaultKind.KERNEL_SOFT_LOCKUP,
        FaultKind.KERNEL_HUNG_TASK,
        FaultKind.IB_LINK_FLAP,
        FaultKind.IB_SYMBOL_ERRORS,
        FaultKind.NVSWITCH_FATAL,
        FaultKind.NVSWITCH_NONFATAL,
    }
)


@dataclass(slots=True)
class Snapshot:
    """Everything one poll saw, by subsystem, plus raw readings for metrics."""

    at: float
    observations: dict[Subsystem, Observation]
    gpus: list[nvml_values.GpuReading] = field(default_factory=list)
    ports: list[sysfs.IbPort] = field(default_factory=list)
    kernel_unparsed: int = 0
    kernel_foreign: int = 0
    """Records that look like driver reports but did not come from the kernel."""
    errors: dict[str, str] = field(default_factory=dict)
    """Source → why it could not be read."""
    labels: dict[str, str | None] | None = None
    """Topology labels for the Node, NVLink's and the InfiniBand leaf's (None: leave them
    as they are; a key left out is left as it is)."""

    def faults(self) -> list[FaultEvent]:
        """Every fault of this poll (state and instant)."""
        return [f for o in self.observations.values() for f in (*o.faults, *o.instant)]


def ib_faults(
    ports: Iterable[sysfs.IbPort],
    previous: dict[tuple[str, int], dict[str, int]],
    profile: SkuProfile,
    *,
    node: str,
    now: float,
) -> list[FaultEvent]:
    """Faults of HCA ports; updates ``previous`` (the counter baselines) in place."""
    out: list[FaultEvent] = []
    for p in ports:
        ident = (p.hca, p.port)
        base = previous.get(ident)
        current = {k: v for k, v in p.counters.items() if v is not None}
        previous[ident] = current

        def add(kind: FaultKind, message: str, *, p: sysfs.IbPort = p, **counters: float) -> None:
            ev = Evidence(hca=p.hca, port=p.port, counters=counters, message=message)
            out.append(FaultEvent(kind, node, now, evidence=ev))

        if p.state is not None and p.state != "ACTIVE":
            add(FaultKind.IB_PORT_DOWN, f"state {p.state}, phys_state {p.phys_state or 'unknown'}")
        elif (
            p.state == "ACTIVE"
            and p.rate_gbps is not None
            and profile.ib_rate_gbps
            and (p.link_layer or "InfiniBand") == "InfiniBand"
            and p.rate_gbps < profile.ib_rate_gbps
        ):
            add(
                FaultKind.IB_RATE_DEGRADED,
                f"rate {p.rate_gbps:g} Gb/s, expected {profile.ib_rate_gbps:g}",
                rate_gbps=p.rate_gbps,
                expected_gbps=profile.ib_rate_gbps,
            )
        if base is None:
            continue
        for name, kind, limit in (
            ("link_downed", FaultKind.IB_LINK_FLAP, 1),
            ("symbol_error", FaultKind.IB_SYMBOL_ERRORS, profile.ib_symbol_errors_max),
        ):
            now_v, before = current.get(name), base.get(name)
            if now_v is None or before is None or now_v < before:
                continue
            if now_v - before >= limit:
                counters = {name: float(now_v), f"{name}_delta": float(now_v - before)}
                ev = Evidence(
                    hca=p.hca,
                    port=p.port,
                    counters=counters,
                    message=f"{name} rose by {now_v - before} (now {now_v})",
                )
                out.append(FaultEvent(kind, node, now, evidence=ev))
    return out


_VALUE_SUBSYSTEM = {
    "handle": Subsystem.GPU,
    "ecc_uncorrected_volatile": Subsystem.GPU,
    "ecc_uncorrected_aggregate": Subsystem.GPU,
    "ecc_corrected_volatile": Subsystem.GPU,
    "remapped_rows": Subsystem.GPU,
    "retired_pages_sbe": Subsystem.GPU,
    "retired_pages_dbe": Subsystem.GPU,
    "retired_pages_pending": Subsystem.GPU,
    "clocks_event_reasons": Subsystem.THERMAL,
    "temperature_c": Subsystem.THERMAL,
    "power_mw": Subsystem.THERMAL,
    "power_limit_mw": Subsystem.THERMAL,
    "pcie_gen": Subsystem.PCIE,
    "pcie_gen_max": Subsystem.PCIE,
    "pcie_width": Subsystem.PCIE,
    "pcie_width_max": Subsystem.PCIE,
    "nvlink_state": Subsystem.NVLINK,
}
"""Which subsystem an unreadable NVML value leaves unknown."""


def unreadable_values(
    readings: Iterable[nvml_values.GpuReading | None],
) -> dict[Subsystem, str]:
    """Subsystems some GPU value of which NVML could not read (feature absent is
    fine; any other failure is not): their condition is Unknown, never healthy.
    A value set without even a GPU index leaves the GPU subsystem unknown. A lost
    GPU is not unknown: it counts as missing."""
    why: dict[Subsystem, list[str]] = {}
    for r in readings:
        if r is None:
            why.setdefault(Subsystem.GPU, []).append("a GPU without a readable index")
            continue
        if r.lost:
            continue
        for key in r.unreadable:
            sub = _VALUE_SUBSYSTEM.get(key, Subsystem.GPU)
            why.setdefault(sub, []).append(f"GPU {r.index} {key}")
    return {
        sub: "NVML could not read " + ", ".join(items[:6]) + (" ..." if len(items) > 6 else "")
        for sub, items in why.items()
    }


class PassiveMonitors:
    """The passive monitors of one node."""

    def __init__(
        self,
        hardware: Hardware,
        profile: SkuProfile,
        *,
        node: str,
        ib_rediscover_s: float = ib_neighbours.REDISCOVER_S,
    ) -> None:
        self.hw = hardware
        self.profile = profile
        self.node = node
        self.leaves = ib_neighbours.LeafDiscovery(hardware.ib_neighbour, ib_rediscover_s)
        """Which leaf switch each rail is cabled to (decision 0249)."""
        self._counters: dict[tuple[str, int], dict[str, int]] = {}
        self._bus_to_gpu: dict[str, int] = {}

    def poll(self, now: float) -> Snapshot:
        """Read every source once."""
        obs: dict[Subsystem, tuple[list[FaultEvent], list[FaultEvent]]] = {
            s: ([], []) for s in AGENT_SUBSYSTEMS
        }
        unreadable: dict[Subsystem, str] = {}
        snap = Snapshot(now, {})

        def put(faults: Iterable[FaultEvent]) -> None:
            for f in faults:
                obs[f.subsystem][1 if f.kind in INSTANT_KINDS else 0].append(f)

        # NVML: GPU presence, memory, clocks, PCIe, NVLink.
        try:
            raw = self.hw.gpus()
            parsed = [nvml_values.parse_gpu(g) for g in raw]
            readings = [r for r in parsed if r is not None]
            snap.gpus = readings
            for sub, why in unreadable_values(parsed).items():
                unreadable[sub] = why
            visible = len(raw) - sum(1 for r in readings if r.lost)
            self._bus_to_gpu = {
                nvml_values.normalize_bus_id(r.pci_bus_id): r.index
                for r in readings
                if r.pci_bus_id
            }
            for r in readings:
                put(nvml_values.gpu_faults(r, self.profile, node=self.node, now=now))
            self._fabric(raw, now, snap, put, unreadable)
            if visible < self.profile.gpus_per_node:
                put(
                    [
                        FaultEvent(
                            FaultKind.GPU_MISSING,
                            self.node,
                            now,
                            evidence=Evidence(
                                counters={
                                    "visible": visible,
                                    "expected": self.profile.gpus_per_node,
                                },
                                message=f"{visible} of {self.profile.gpus_per_node} GPUs visible"
                                + (f" ({len(raw) - visible} lost)" if visible < len(raw) else ""),
                            ),
                        )
                    ]
                )
        except (NoGpuFound, HardwareError) as exc:
            snap.errors["nvml"] = str(exc)
            for s in GPU_SUBSYSTEMS:
                unreadable[s] = f"NVML: {exc}"

        # Kernel log: XIDs, soft lockups, hung tasks.
        try:
            scan = kmsg.scan(
                self.hw.kernel_lines(), node=self.node, now=now, gpu_for_bus=self._bus_to_gpu
            )
            snap.kernel_unparsed = scan.unparsed
            snap.kernel_foreign = scan.foreign
            if scan.foreign:
                log.warning(
                    "node=%s %d kernel-log record(s) look like driver reports but were not "
                    "written by the kernel (ignored)",
                    self.node,
                    scan.foreign,
                )
            put(scan.faults)
        except HardwareError as exc:
            snap.errors["kmsg"] = str(exc)
            unreadable[Subsystem.KERNEL] = f"kernel log: {exc}"

        # InfiniBand ports.
        ports = sysfs.read_ib_ports(Path(self.hw.sysfs_root))
        if ports is None:
            unreadable[Subsystem.INFINIBAND] = "no /sys/class/infiniband (no HCA or driver)"
        else:
            snap.ports = ports
            put(ib_faults(ports, self._counters, self.profile, node=self.node, now=now))
            put(self._hca_pcie(ports, now, unreadable))
            blind = [f"{p.hca}/{p.port}" for p in ports if p.state is None]
            if blind:
                unreadable[Subsystem.INFINIBAND] = "state unreadable: " + ", ".join(blind[:8])
        self._leaf(ports, now, snap)

        for s, (state, instant) in obs.items():
            why = unreadable.get(s, "")
            snap.observations[s] = Observation(
                at=now,
                faults=tuple(state),
                instant=tuple(instant),
                readable=not why,
                unreadable_reason=why,
            )
        return snap

    def _fabric(
        self,
        raw: list[dict[str, object]],
        now: float,
        snap: Snapshot,
        put: Callable[[Iterable[FaultEvent]], None],
        unreadable: dict[Subsystem, str],
    ) -> None:
        """Fabric Manager registration, IMEX where it applies, and the clique labels."""
        gpus = [f for f in (fabric.from_raw(g) for g in raw) if f is not None]
        why = fabric.unreadable(gpus)
        if why is not None:
            unreadable[Subsystem.FABRIC] = why
            return
        imex = None
        if any(g.multi_node for g in gpus):
            try:
                imex = self.hw.imex_status()
            except HardwareError as exc:
                snap.errors["imex"] = str(exc)
                unreadable[Subsystem.FABRIC] = f"IMEX: {exc}"
        put(fabric.faults(gpus, node=self.node, now=now, imex=imex))
        snap.labels = fabric.topology_labels(gpus)

    def _leaf(self, ports: list[sysfs.IbPort] | None, now: float, snap: Snapshot) -> None:
        """The leaf switch labels, beside the NVLink ones (an unknown leaf: unchanged)."""
        before = self.leaves.view
        labels = self.leaves.labels(ports, now)
        view = self.leaves.view
        if view is not None and (before is None or view.describe() != before.describe()):
            log.info("node=%s InfiniBand rails: %s", self.node, view.describe() or "none")
            for where, why in sorted(self.leaves.errors.items()):
                log.info("node=%s %s: neighbour unknown: %s", self.node, where, why)
        if labels is not None:
            snap.labels = {**(snap.labels or {}), **labels}

    def _hca_pcie(
        self, ports: list[sysfs.IbPort], now: float, unreadable: dict[Subsystem, str]
    ) -> list[FaultEvent]:
        """HCA PCIe links; a link whose width cannot be read leaves PCIe unknown."""
        out: list[FaultEvent] = []
        seen: set[str] = set()
        for p in ports:
            if p.pci_address is None or p.pci_address in seen:
                continue
            seen.add(p.pci_address)
            link = sysfs.read_pci_link(Path(self.hw.sysfs_root), p.pci_address)
            if link is None or link.width is None or link.max_width is None:
                unreadable.setdefault(Subsystem.PCIE, f"HCA {p.hca} PCIe link unreadable")
            if link is not None and link.degraded:
                out.append(
                    FaultEvent(
                        FaultKind.PCIE_DEGRADED,
                        self.node,
                        now,
                        evidence=Evidence(
                            hca=p.hca,
                            pci_bus_id=p.pci_address,
                            counters={
                                "speed_gts": link.speed or 0,
                                "max_speed_gts": link.max_speed or 0,
                                "width": link.width or 0,
                                "max_width": link.max_width or 0,
                            },
                            message=f"HCA PCIe link {link.speed:g} GT/s x{link.width} "
                            f"of {link.max_speed:g} GT/s x{link.max_width}",
                        ),
                    )
                )
        return out
