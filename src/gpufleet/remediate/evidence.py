"""Did a reset happen? What a BMC shows before and after, and the write-ahead mark.

A ``ComputerSystem.Reset`` POST is not idempotent: posting it twice power
cycles the machine twice. When its answer is lost (a timeout, a 5xx, a
controller killed in the middle) the only safe way forward is to *read* the
BMC and compare with what it showed just before the POST:

1. ``LastResetTime`` (ComputerSystem v1.15+): changed since the baseline ->
   the reset happened; unchanged -> it did not (the only source that can say
   "no");
2. otherwise the system's log services (SEL / event log): a new entry about a
   reset, power or boot -> it happened; nothing new proves nothing (BMCs log
   differently and late);
3. otherwise a power state that differs from the baseline -> it happened.

:class:`ActionMark` is what the controller stores on the Node *before* it
posts (annotation ``gpufleet.io/bmc-action``): which attempt of which step,
the baseline, the reset type and when it was posted. A restarted controller
reads it to tell "never posted" from "posted, answer lost".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

RESET_WORDS = ("reset", "power", "boot", "restart", "cycle")
"""Words in a log entry's MessageId or Message that count as evidence of a reset."""


@dataclass(frozen=True, slots=True)
class ResetEvidence:
    """What a BMC shows that a reset would change. None: the BMC does not report it."""

    last_reset_time: str | None = None
    power_state: str | None = None
    log_newest: str | None = None
    """``Created`` of the newest entry in the system's logs (the baseline), if any."""
    log_resets: tuple[str, ...] = field(default=())
    """``Created`` of the entries that mention a reset, power or boot."""

    def to_json(self) -> dict[str, Any]:
        """The baseline as stored in the mark (the log entries themselves are not kept)."""
        return {
            "lastResetTime": self.last_reset_time,
            "powerState": self.power_state,
            "logNewest": self.log_newest,
        }

    @classmethod
    def from_json(cls, data: Any) -> ResetEvidence:
        d = data if isinstance(data, dict) else {}
        return cls(
            last_reset_time=_str(d.get("lastResetTime")),
            power_state=_str(d.get("powerState")),
            log_newest=_str(d.get("logNewest")),
        )


def reset_since(
    before: ResetEvidence, after: ResetEvidence, reset_type: str | None = None
) -> bool | None:
    """Whether a reset happened between the two readings; None when it cannot be told.

    A ``ForceOff`` is judged by the power state alone: a power-off is not a reset, so
    ``LastResetTime`` does not move (real BMCs and both emulators); read by it, every
    ``ForceOff`` of a ForceOff + On power cycle looked "not performed" and the machine
    was left off."""
    if reset_type == "ForceOff" and after.power_state is not None:
        return after.power_state == "Off"
    if after.last_reset_time is not None:
        return after.last_reset_time != before.last_reset_time
    if before.log_newest is not None or after.log_resets:
        newest = before.log_newest or ""
        if any(created > newest for created in after.log_resets):
            return True
    if before.power_state and after.power_state and before.power_state != after.power_state:
        return True
    return None


@dataclass(frozen=True, slots=True)
class ActionMark:
    """The write-ahead record of one Reset POST, bound to one ladder attempt."""

    step: str
    attempt: int
    started_at: float
    """The attempt's ``StepAttempt.started_at``: binds the mark to one decision."""
    reset_type: str
    baseline: ResetEvidence
    posted_at: float

    def binds(self, step: str, attempt: int, started_at: float) -> bool:
        """Whether this mark belongs to that attempt (and not an earlier one)."""
        return (
            self.step == step
            and self.attempt == attempt
            and abs(self.started_at - started_at) < 1e-6
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "step": self.step,
                "attempt": self.attempt,
                "startedAt": self.started_at,
                "resetType": self.reset_type,
                "baseline": self.baseline.to_json(),
                "postedAt": self.posted_at,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | None) -> ActionMark | None:
        """The mark, or None if absent or unreadable (then it binds nothing)."""
        if not text:
            return None
        try:
            d = json.loads(text)
            return cls(
                step=str(d["step"]),
                attempt=int(d["attempt"]),
                started_at=float(d["startedAt"]),
                reset_type=str(d["resetType"]),
                baseline=ResetEvidence.from_json(d.get("baseline")),
                posted_at=float(d["postedAt"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


def _str(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None
