"""sysfs readers: InfiniBand ports and PCIe links.

Both take a *root* directory so that the same code reads the real ``/sys``
and the tree the simulated backend writes (or a test fixture). Files that
are missing or hold garbage give ``None`` ("unknown"), never an exception
and never a fault.

Formats (``drivers/infiniband/core/sysfs.c``, ``drivers/pci/pci-sysfs.c``)::

    /sys/class/infiniband/mlx5_0/ports/1/state          4: ACTIVE
    /sys/class/infiniband/mlx5_0/ports/1/phys_state     5: LinkUp
    /sys/class/infiniband/mlx5_0/ports/1/rate           400 Gb/sec (4X NDR)
    /sys/class/infiniband/mlx5_0/ports/1/link_layer     InfiniBand
    /sys/class/infiniband/mlx5_0/ports/1/counters/link_downed     3
    /sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error    0
    /sys/class/infiniband/mlx5_0/ports/1/sm_lid         0x1
    /sys/class/infiniband/mlx5_0/node_guid              fc6a:1c03:00e7:a941
    /sys/bus/pci/devices/0000:3b:00.0/current_link_speed  32.0 GT/s PCIe   (older: 8 GT/s)
    /sys/bus/pci/devices/0000:3b:00.0/current_link_width  16
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

IB_CLASS = Path("sys/class/infiniband")
PCI_DEVICES = Path("sys/bus/pci/devices")
COUNTERS = ("link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors")

_STATE = re.compile(r"^\s*(\d+)\s*:\s*(\S+)")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_SPEED = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None


def parse_state(text: str | None) -> str | None:
    """``4: ACTIVE`` → ``ACTIVE``; None when unreadable."""
    if text is None:
        return None
    m = _STATE.match(text)
    return m[2].upper() if m else None


def parse_rate(text: str | None) -> float | None:
    """``400 Gb/sec (4X NDR)`` → 400.0."""
    if text is None:
        return None
    m = _RATE.match(text)
    return float(m[1]) if m else None


def parse_counter(text: str | None) -> int | None:
    """A non-negative decimal counter; None for garbage."""
    if text is None or not text.isdigit():
        return None
    return int(text)


def parse_guid(text: str | None) -> str | None:
    """``fc6a:1c03:00e7:a941`` -> ``0xfc6a1c0300e7a941``; None for garbage."""
    digits = (text or "").replace(":", "")
    if len(digits) != 16 or not all(c in "0123456789abcdefABCDEF" for c in digits):
        return None
    return "0x" + digits.lower()


def parse_lid(text: str | None) -> int | None:
    """``0x1`` -> 1; None for garbage."""
    try:
        return int(text or "", 16)
    except ValueError:
        return None


def parse_speed(text: str | None) -> float | None:
    """``32.0 GT/s PCIe`` / ``8 GT/s`` → GT/s as float; ``Unknown`` → None."""
    if text is None:
        return None
    m = _SPEED.match(text)
    return float(m[1]) if m else None


@dataclass(frozen=True, slots=True)
class IbPort:
    """One HCA port as sysfs shows it; ``None`` fields are unknown."""

    hca: str
    port: int
    state: str | None
    phys_state: str | None
    rate_gbps: float | None
    link_layer: str | None
    counters: dict[str, int | None] = field(default_factory=dict)
    pci_address: str | None = None
    node_guid: str | None = None
    """The HCA's node GUID, ``0x`` and 16 hex digits (new hardware: a new GUID)."""
    sm_lid: int | None = None
    """The LID of the subnet manager the port reports to (0: none)."""


def read_ib_ports(root: Path) -> list[IbPort] | None:
    """Every HCA port under ``root``; None when there is no InfiniBand class at all."""
    base = root / IB_CLASS
    if not base.is_dir():
        return None
    ports: list[IbPort] = []
    for hca in sorted(p for p in base.iterdir() if p.is_dir()):
        pci = None
        try:
            pci = (hca / "device").resolve(strict=True).name
        except OSError:
            pci = None
        node_guid = parse_guid(_read(hca / "node_guid"))
        port_dir = hca / "ports"
        if not port_dir.is_dir():
            continue
        for pdir in sorted(port_dir.iterdir(), key=lambda p: p.name):
            if not pdir.name.isdigit():
                continue
            counters = {c: parse_counter(_read(pdir / "counters" / c)) for c in COUNTERS}
            ports.append(
                IbPort(
                    hca=hca.name,
                    port=int(pdir.name),
                    state=parse_state(_read(pdir / "state")),
                    phys_state=parse_state(_read(pdir / "phys_state")),
                    rate_gbps=parse_rate(_read(pdir / "rate")),
                    link_layer=_read(pdir / "link_layer"),
                    counters=counters,
                    pci_address=pci if pci and ":" in pci else None,
                    node_guid=node_guid,
                    sm_lid=parse_lid(_read(pdir / "sm_lid")),
                )
            )
    return ports


@dataclass(frozen=True, slots=True)
class PciLink:
    """A PCIe device's link: current and maximum speed (GT/s) and width (lanes)."""

    address: str
    speed: float | None
    max_speed: float | None
    width: int | None
    max_width: int | None

    @property
    def degraded(self) -> bool | None:
        """True when trained below max; None when unknown."""
        if None in (self.speed, self.max_speed, self.width, self.max_width):
            return None
        assert self.speed is not None and self.max_speed is not None
        assert self.width is not None and self.max_width is not None
        return self.width < self.max_width or self.speed < self.max_speed


def read_pci_link(root: Path, address: str) -> PciLink | None:
    """The link of one PCI device (``0000:3b:00.0``); None when the device is absent."""
    dev = root / PCI_DEVICES / address
    if not dev.is_dir():
        return None
    return PciLink(
        address=address,
        speed=parse_speed(_read(dev / "current_link_speed")),
        max_speed=parse_speed(_read(dev / "max_link_speed")),
        width=parse_counter(_read(dev / "current_link_width")),
        max_width=parse_counter(_read(dev / "max_link_width")),
    )


def write_ib_port(root: Path, port: IbPort, *, rate_text: str | None = None) -> None:
    """Write one port in sysfs format (used by the simulated backend and tests)."""
    pdir = root / IB_CLASS / port.hca / "ports" / str(port.port)
    (pdir / "counters").mkdir(parents=True, exist_ok=True)
    codes = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4}
    phys = {"SLEEP": 1, "POLLING": 2, "DISABLED": 3, "LINKUP": 5}
    if port.state is not None:
        (pdir / "state").write_text(f"{codes.get(port.state, 0)}: {port.state}\n")
    if port.phys_state is not None:
        label = "LinkUp" if port.phys_state == "LINKUP" else port.phys_state.capitalize()
        (pdir / "phys_state").write_text(f"{phys.get(port.phys_state, 0)}: {label}\n")
    if port.rate_gbps is not None:
        text = rate_text or f"{port.rate_gbps:g} Gb/sec (4X {_gen(port.rate_gbps)})"
        (pdir / "rate").write_text(text + "\n")
    (pdir / "link_layer").write_text((port.link_layer or "InfiniBand") + "\n")
    if port.sm_lid is not None:
        (pdir / "sm_lid").write_text(f"0x{port.sm_lid:x}\n")
    if port.node_guid is not None:
        g = port.node_guid.removeprefix("0x")
        (root / IB_CLASS / port.hca / "node_guid").write_text(
            ":".join(g[i : i + 4] for i in range(0, 16, 4)) + "\n"
        )
    for name, value in port.counters.items():
        if value is not None:
            (pdir / "counters" / name).write_text(f"{value}\n")


def _gen(rate: float) -> str:
    return {400: "NDR", 200: "HDR", 100: "EDR", 56: "FDR"}.get(int(rate), "SDR")
