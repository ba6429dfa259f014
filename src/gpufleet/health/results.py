"""Check results: a status, a reason, the measurement and the evidence.

Statuses follow the Nagios plugin codes (OK 0, WARNING 1, CRITICAL 2,
UNKNOWN 3) so that ``gpufleet health check`` works unchanged as a Slurm
prolog/epilog or a Nagios plugin. UNKNOWN means "could not tell" (no GPU,
unreadable file, garbage counter): it is never reported as a fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from gpufleet.domain.faults import FaultEvent


class CheckStatus(IntEnum):
    """Nagios-compatible status; the value is the exit code."""

    OK = 0
    WARNING = 1
    CRITICAL = 2
    UNKNOWN = 3

    @property
    def label(self) -> str:
        """Short text for tables: pass, warn, fail, unknown."""
        return ("pass", "warn", "fail", "unknown")[self.value]


SEVERITY = (CheckStatus.OK, CheckStatus.UNKNOWN, CheckStatus.WARNING, CheckStatus.CRITICAL)
"""Statuses from least to most severe (UNKNOWN ranks below a real failure)."""


def worst(statuses: list[CheckStatus]) -> CheckStatus:
    """The most severe status of several (OK when there are none)."""
    return max(statuses, key=SEVERITY.index, default=CheckStatus.OK)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check on one node."""

    name: str
    status: CheckStatus
    reason: str
    measured: float | None = None
    threshold: float | None = None
    unit: str = ""
    faults: tuple[FaultEvent, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def failed(self) -> bool:
        """Whether the check found a problem."""
        return self.status in (CheckStatus.WARNING, CheckStatus.CRITICAL)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (faults with their evidence)."""
        return {
            "name": self.name,
            "status": self.status.label,
            "reason": self.reason,
            "measured": self.measured,
            "threshold": self.threshold,
            "unit": self.unit,
            "duration_s": round(self.duration_s, 4),
            "faults": [fault_json(f) for f in self.faults],
            "details": self.details,
        }


def fault_json(fault: FaultEvent) -> dict[str, Any]:
    """A fault and its evidence as a JSON-ready dict."""
    ev = fault.evidence
    return {
        "kind": fault.kind.value,
        "key": fault.key,
        "xid": fault.xid,
        "subsystem": fault.subsystem.value,
        "at": fault.at,
        "gpu": ev.gpu_index,
        "pci_bus_id": ev.pci_bus_id,
        "hca": ev.hca,
        "port": ev.port,
        "counters": dict(ev.counters),
        "message": ev.message,
        "recovery_action": ev.recovery_action,
        "summary": f"{fault.describe()}: {ev.summary()}",
    }


def from_faults(name: str, faults: list[FaultEvent], ok_reason: str, **extra: Any) -> CheckResult:
    """CRITICAL naming the faults, or OK with ``ok_reason``."""
    if faults:
        reason = "; ".join(f"{f.describe()}: {f.evidence.summary()}" for f in faults[:4])
        if len(faults) > 4:
            reason += f"; and {len(faults) - 4} more"
        return CheckResult(name, CheckStatus.CRITICAL, reason, faults=tuple(faults), **extra)
    return CheckResult(name, CheckStatus.OK, ok_reason, **extra)
