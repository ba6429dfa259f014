"""Kernel log parsing: NVIDIA XIDs, soft lockups and hung tasks.

Reads both forms the kernel produces:

* ``/dev/kmsg`` records: ``<prio>,<seq>,<usec>,<flags>[,...];<text>`` followed by
  optional continuation lines that start with a space (`` SUBSYSTEM=pci``);
* ``dmesg`` lines: ``[ 1234.567890] <text>`` (used in fixtures and bug reports).

XID line formats differ between driver versions; all of these are real::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.                  (470, 515)
    NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.  (525+)
    NVRM: Xid (0000:3b:00): 13, Graphics Exception: ...                                  (older)
    NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)

"GPU has fallen off the bus" without an XID (``NVRM: GPU at PCI:0000:3b:00: GPU has
fallen off the bus.``) is reported as XID 79 too, since some drivers print only that.

Anything that does not parse is counted as *unparsed*, never turned into a fault.
"""  # noqa: E501

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind

_KMSG = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<text>.*)$")
_DMESG = re.compile(r"^\[\s*(?P<sec>\d+\.\d+)\]\s(?P<text>.*)$")
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?\):"
    r"\s*(?P<xid>\d+)\s*,\s*(?P<rest>.*)$"
)
_OFF_BUS = re.compile(
    r"NVRM: GPU at PCI:(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?:"
    r"\s*GPU has fallen off the bus"
)
_RECOVERY = re.compile(r"recovery action changed from .*? to 0x[0-9a-fA-F]+ \((?P<action>[^)]*)\)")
_SOFT_LOCKUP = re.compile(
    r"soft lockup - CPU#(?P<cpu>\d+) stuck for (?P<secs>\d+)s!\s*\[(?P<task>.*)\]"
)
_HUNG = re.compile(
    r"INFO: task (?P<task>.+):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds"
)

RECOVERY_ACTIONS = {
    "none": None,
    "gpu reset required": "gpu-reset",
    "node reboot required": "node-reboot",
    "drain p2p": "drain-p2p",
    "drain and reset": "drain-and-reset",
    "bus reset required": "bus-reset",
    "system reboot required": "system-reboot",
}
"""XID 154 recovery-action text → gpufleet's action names (see domain.xids.XID_154_ACTIONS)."""


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One kernel log record."""

    text: str
    seq: int | None = None
    usec: int | None = None
    """Microseconds since boot (kernel monotonic clock)."""


def parse_record(line: str) -> KernelRecord | None:
    """One record from a kmsg or dmesg line; None for continuation lines and garbage."""
    if not line or line.startswith(" "):
        return None
    line = line.rstrip("\n")
    m = _KMSG.match(line)
    if m:
        return KernelRecord(m["text"], int(m["seq"]), int(m["usec"]))
    m = _DMESG.match(line)
    if m:
        return KernelRecord(m["text"], None, int(float(m["sec"]) * 1_000_000))
    if line.startswith(("NVRM:", "watchdog:", "BUG:", "INFO:")):
        return KernelRecord(line)
    return None


@dataclass(frozen=True, slots=True)
class KernelScan:
    """What a batch of kernel log lines held."""

    faults: tuple[FaultEvent, ...]
    records: int
    unparsed: int
    """Lines that mention NVRM/lockups but could not be parsed (reported, not faulted)."""


def scan(
    lines: Iterable[str],
    *,
    node: str,
    now: float,
    gpu_for_bus: Callable[[str], int | None] | Mapping[str, int] = lambda bus: None,
) -> KernelScan:
    """Faults in kernel log lines. ``gpu_for_bus`` maps ``0000:3b:00`` to a GPU index."""
    lookup = gpu_for_bus.get if isinstance(gpu_for_bus, Mapping) else gpu_for_bus
    faults: list[FaultEvent] = []
    records = unparsed = 0
    for line in lines:
        rec = parse_record(line)
        if rec is None:
            if "NVRM: Xid" in line or "soft lockup" in line:
                unparsed += 1
            continue
        records += 1
        fault = _fault(rec, node, now, lookup)
        if fault is None and ("NVRM: Xid" in rec.text or "soft lockup" in rec.text):
            unparsed += 1
        if fault is not None:
            faults.append(fault)
    return KernelScan(tuple(faults), records, unparsed)


def _bus(raw: str) -> str:
    domain, bus, dev = raw.lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{dev}"


def _fault(
    rec: KernelRecord, node: str, now: float, lookup: Callable[[str], int | None]
) -> FaultEvent | None:
    text = rec.text
    m = _XID.search(text)
    if m:
        bus = _bus(m["bus"])
        xid = int(m["xid"])
        action = None
        if xid == 154:
            r = _RECOVERY.search(m["rest"])
            if r is None:
                return None  # a 154 without its action is unusable; counted as unparsed
            action = RECOVERY_ACTIONS.get(r["action"].strip().lower(), r["action"].strip().lower())
        ev = Evidence(
            gpu_index=lookup(bus), pci_bus_id=bus, message=text.strip(), recovery_action=action
        )
        return FaultEvent(FaultKind.XID, node, now, xid=xid, evidence=ev)
    m = _OFF_BUS.search(text)
    if m:
        bus = _bus(m["bus"])
        ev = Evidence(gpu_index=lookup(bus), pci_bus_id=bus, message=text.strip())
        return FaultEvent(FaultKind.XID, node, now, xid=79, evidence=ev)
    m = _SOFT_LOCKUP.search(text)
    if m:
        ev = Evidence(
            counters={"cpu": int(m["cpu"]), "stuck_seconds": int(m["secs"])},
            message=text.strip(),
        )
        return FaultEvent(FaultKind.KERNEL_SOFT_LOCKUP, node, now, evidence=ev)
    m = _HUNG.search(text)
    if m:
        ev = Evidence(
            counters={"pid": int(m["pid"]), "blocked_seconds": int(m["secs"])},
            message=text.strip(),
        )
        return FaultEvent(FaultKind.KERNEL_HUNG_TASK, node, now, evidence=ev)
    return None


def kmsg_line(text: str, *, seq: int, usec: int, prio: int = 3) -> str:
    """Format a record as ``/dev/kmsg`` does (used by the simulated backend)."""
    return f"{prio},{seq},{usec},-;{text}"
