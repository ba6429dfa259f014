"""Kernel log parsing: NVIDIA XIDs, NVSwitch SXids, soft lockups and hung tasks.

Reads every form a kernel log reaches an operator in:

* ``/dev/kmsg`` records: ``<prio>,<seq>,<usec>,<flags>[,...];<text>`` followed by
  optional continuation lines that start with a space (`` SUBSYSTEM=pci``). Only
  records of the kernel facility (``prio >> 3 == 0``) count: anything a process
  writes into ``/dev/kmsg`` arrives with facility ``user`` and is never a fault;
* ``dmesg`` lines: ``[ 1234.567890] <text>``, ``dmesg -T`` lines
  (``[Wed Jul 31 23:14:18 2024] <text>``) and ``dmesg --time-format iso`` lines,
  optionally with ``-x`` facility and level (``kern  :err   : 2025-01-25T...``);
  a record that spans lines continues on lines that start with whitespace;
* journald / syslog lines (``journalctl -k``, ``/var/log/kern.log``):
  ``Nov 14 13:05:59 host kernel: <text>``; only the ``kernel`` identifier counts.

Driver line formats, all real (fixtures in tests/fixtures/health/driver-lines.yaml
name the public report or driver source of each)::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
    NVRM: Xid (0000:3b:00): 13, Graphics Exception: ...                       (older)
    NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 31, pid=..., name=..., ...  (MIG)
    NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)
    NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 ...)
    nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt
    NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.
    NVRM: The NVIDIA GPU 0000:b3:00.0 / NVRM: (PCI ID: 10de:26b5) installed in this system has
        / NVRM: fallen off the bus and is not responding to commands.   (one record, three lines)

The last two are reported as XID 79: some drivers print only them. A MIG line is
attributed to its physical GPU (what a reset acts on) and carries the GPU and
compute instance as evidence. An SXid's ``Severity`` and ``Data`` lines detail
the line before them and are not faults of their own.

Anything that does not parse is counted as *unparsed*, never turned into a fault.
"""  # noqa: E501

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind

_BUS = r"(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?"
_KMSG = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<text>.*)$")
_DMESG = re.compile(r"^\[\s*(?P<sec>\d+\.\d+)\]\s(?P<text>.*)$")
_DMESG_CTIME = re.compile(
    r"^\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\]"
    r"\s(?P<text>.*)$"
)
_DMESG_ISO = re.compile(
    r"^(?:(?P<facility>[a-z0-9]+)\s*:(?P<level>[a-z]+)\s*:\s*)?"
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[,.]\d+(?:[+-]\d\d:?\d\d|Z)\s(?P<text>.*)$"
)
_JOURNAL = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?|\d{4}-\d\d-\d\dT\S+)\s+\S+\s+"
    r"(?P<ident>[^\s:\[]+)(?:\[\d+\])?:\s(?P<text>.*)$"
)
_BARE_KERNEL = re.compile(r"^kernel:\s(?P<text>.*)$")
_ISO_JOURNAL_HOST = re.compile(r"^[\w.-]+ kernel: ")
_KMSG_DICT = re.compile(r"^ [A-Z0-9_]+=")
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?" + _BUS + r"(?:\s+GPU-I:(?P<gi>\d+))?(?:\s+GPU-CI:(?P<ci>\d+))?\):"
    r"\s*(?P<xid>\d+)\s*,\s*(?P<rest>.*)$",
    re.S,
)
_SXID = re.compile(
    r"(?:(?P<dev>[\w.-]+): )?SXid \(PCI:" + _BUS + r"\):\s*(?P<sxid>\d+),\s*(?P<rest>.*)$", re.S
)
_SXID_SEVERITY = re.compile(r"^(?P<sev>Fatal|Non-fatal),\s*(?:Link\s+(?P<link>-?\d+))?")
_SXID_DETAIL = re.compile(r"^(?:Severity \d|Data \{)")
_OFF_BUS = re.compile(r"NVRM: GPU at PCI:" + _BUS + r":\s*GPU has fallen off the bus")
_OFF_BUS_NEW = re.compile(
    r"NVRM: The NVIDIA GPU " + _BUS + r"\s.*?fallen off the bus and is not responding", re.S
)
_RECOVERY = re.compile(r"recovery action changed from .*? to 0x[0-9a-fA-F]+ \((?P<action>[^)]*)\)")
_SOFT_LOCKUP = re.compile(
    r"soft lockup - CPU#(?P<cpu>\d+) stuck for (?P<secs>\d+)s!\s*\[(?P<task>.*)\]"
)
_HUNG = re.compile(
    r"INFO: task (?P<task>.+):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds"
)
_DRIVER_MARKS = ("NVRM: Xid", "SXid (", "soft lockup", "fallen off the bus")
"""Text that means "a driver or watchdog report": a line holding one that does not
parse is counted as unparsed, so a new driver format is noticed, not dropped."""

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
    kernel: bool = True
    """False for a record that did not come from the kernel (a ``/dev/kmsg`` record
    of another facility, a journal line of another program): never a fault."""


def parse_record(line: str) -> KernelRecord | None:
    """One record from a kmsg, dmesg or journal line; None for continuation lines
    and garbage."""
    if not line or line[0].isspace():
        return None
    line = line.rstrip("\n")
    m = _KMSG.match(line)
    if m:
        text = m["text"].replace("\\x0a", "\n")  # kmsg escapes a record's inner newlines
        kernel = int(m["prio"]) >> 3 == 0
        return KernelRecord(text, int(m["seq"]), int(m["usec"]), kernel=kernel)
    m = _DMESG.match(line)
    if m:
        return KernelRecord(m["text"], None, int(float(m["sec"]) * 1_000_000))
    m = _DMESG_CTIME.match(line)
    if m:
        return KernelRecord(m["text"])
    m = _DMESG_ISO.match(line)
    if m:
        text = m["text"]
        host = _ISO_JOURNAL_HOST.match(text)  # journalctl -o short-iso-precise
        if host:
            text = text[host.end() :]
        return KernelRecord(text, kernel=m["facility"] in (None, "kern"))
    m = _JOURNAL.match(line)
    if m:
        return KernelRecord(m["text"], kernel=m["ident"] == "kernel")
    m = _BARE_KERNEL.match(line)
    if m:
        return KernelRecord(m["text"])
    if line.startswith(("NVRM:", "watchdog:", "BUG:", "INFO:", "nvidia-nvswitch")):
        return KernelRecord(line)
    return None


@dataclass(frozen=True, slots=True)
class KernelScan:
    """What a batch of kernel log lines held."""

    faults: tuple[FaultEvent, ...]
    records: int
    unparsed: int
    """Lines that mention a driver or watchdog report but could not be parsed
    (reported, not faulted)."""
    foreign: int = 0
    """Records that look like driver reports but did not come from the kernel
    (written to ``/dev/kmsg`` by a process, or logged by another program)."""


def _records(lines: Iterable[str]) -> Iterable[KernelRecord | str]:
    """Records, with a record's continuation lines joined to it; a line that is
    no record is yielded as it is (for the unparsed count)."""
    pending: KernelRecord | None = None
    for line in lines:
        rec = parse_record(line)
        if rec is not None:
            if pending is not None:
                yield pending
            pending = rec
            continue
        continued = line[:1].isspace() and not _KMSG_DICT.match(line) and line.strip()
        if continued and pending is not None:
            pending = KernelRecord(
                f"{pending.text}\n{line.strip()}", pending.seq, pending.usec, pending.kernel
            )
            continue
        if pending is not None and not (line[:1].isspace() or not line.strip()):
            yield pending
            pending = None
        if line.strip() and not _KMSG_DICT.match(line):
            yield line
    if pending is not None:
        yield pending


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
    records = unparsed = foreign = 0
    for item in _records(lines):
        if isinstance(item, str):
            if _reports(item):
                unparsed += 1
            continue
        records += 1
        if not item.kernel:
            if _reports(item.text):
                foreign += 1
            continue
        try:
            fault = _fault(item, node, now, lookup)
        except _NotAFault:
            continue
        if fault is None:
            if _reports(item.text):
                unparsed += 1
            continue
        faults.append(fault)
    return KernelScan(tuple(faults), records, unparsed, foreign)


def _reports(text: str) -> bool:
    return any(mark in text for mark in _DRIVER_MARKS)


class _NotAFault(Exception):
    """A recognised record that details another (an SXid's Severity or Data line)."""


def _bus(raw: str) -> str:
    domain, bus, dev = raw.lower().split(":")
    return f"{int(domain, 16):04x}:{bus}:{dev}"


def _fault(
    rec: KernelRecord, node: str, now: float, lookup: Callable[[str], int | None]
) -> FaultEvent | None:
    text = rec.text
    message = " ".join(text.split())
    m = _XID.search(text)
    if m:
        bus = _bus(m["bus"])
        xid = int(m["xid"])
        if xid <= 0:
            return None  # not an XID any driver prints; counted as unparsed
        action = None
        if xid == 154:
            r = _RECOVERY.search(m["rest"])
            if r is None:
                return None  # a 154 without its action is unusable; counted as unparsed
            action = RECOVERY_ACTIONS.get(r["action"].strip().lower(), r["action"].strip().lower())
        ev = Evidence(
            gpu_index=lookup(bus),
            pci_bus_id=bus,
            message=message,
            recovery_action=action,
            gpu_instance=int(m["gi"]) if m["gi"] is not None else None,
            compute_instance=int(m["ci"]) if m["ci"] is not None else None,
        )
        return FaultEvent(FaultKind.XID, node, now, xid=xid, evidence=ev)
    m = _SXID.search(text)
    if m:
        return _sxid(m, message, node, now)
    m = _OFF_BUS.search(text) or _OFF_BUS_NEW.search(text)
    if m:
        bus = _bus(m["bus"])
        ev = Evidence(gpu_index=lookup(bus), pci_bus_id=bus, message=message)
        return FaultEvent(FaultKind.XID, node, now, xid=79, evidence=ev)
    m = _SOFT_LOCKUP.search(text)
    if m:
        ev = Evidence(
            counters={"cpu": int(m["cpu"]), "stuck_seconds": int(m["secs"])},
            message=message,
        )
        return FaultEvent(FaultKind.KERNEL_SOFT_LOCKUP, node, now, evidence=ev)
    m = _HUNG.search(text)
    if m:
        ev = Evidence(
            counters={"pid": int(m["pid"]), "blocked_seconds": int(m["secs"])},
            message=message,
        )
        return FaultEvent(FaultKind.KERNEL_HUNG_TASK, node, now, evidence=ev)
    return None


def _sxid(m: re.Match[str], message: str, node: str, now: float) -> FaultEvent | None:
    """An NVSwitch SXid line: fatal or non-fatal, with the switch, its PCI address,
    the SXid number and the link."""
    rest = m["rest"].strip()
    sev = _SXID_SEVERITY.match(rest)
    if sev is None:
        if _SXID_DETAIL.match(rest):
            raise _NotAFault
        return None
    counters: dict[str, float] = {"sxid": int(m["sxid"])}
    if sev["link"] is not None:
        counters["link"] = int(sev["link"])
    switch = m["dev"] or f"nvswitch@{_bus(m['bus'])}"
    kind = FaultKind.NVSWITCH_FATAL if sev["sev"] == "Fatal" else FaultKind.NVSWITCH_NONFATAL
    ev = Evidence(pci_bus_id=_bus(m["bus"]), switch=switch, counters=counters, message=message)
    return FaultEvent(kind, node, now, evidence=ev)


def kmsg_line(text: str, *, seq: int, usec: int, prio: int = 3) -> str:
    """Format a record as ``/dev/kmsg`` does (used by the simulated backend)."""
    return f"{prio},{seq},{usec},-;{text}"
