"""``status.conditions`` of gpufleet's custom resources, with ``metav1.Condition`` semantics.

One place for the rules every writer follows (the controller's FleetPolicy and
NodeRemediation status, the SlurmCluster operator, the Machine status):

- conditions are merged **by type**: setting one leaves the others as they are
  (a merge patch replaces a list whole, so writers send the merged list);
- ``lastTransitionTime`` changes only when the condition's ``status`` changes
  (a new reason or message is not a transition);
- ``observedGeneration`` says which ``metadata.generation`` the condition was
  computed from, so a reader can tell a stale condition from a current one.

Times are RFC 3339 UTC (``domain.enrollment.rfc3339``); ``now`` is an argument.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gpufleet.domain.enrollment import rfc3339

Status = Literal["True", "False", "Unknown"]

MAX_MESSAGE = 1000
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")


def condition(
    type_: str,
    status: Status,
    reason: str,
    message: str,
    *,
    since: float,
    observed_generation: int | None = None,
) -> dict[str, Any]:
    """One condition, as ``metav1.Condition`` spells it (reason CamelCase, message bounded)."""
    if not _REASON.match(reason):
        raise ValueError(f"condition reason {reason!r} is not CamelCase (metav1.Condition)")
    out: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "lastTransitionTime": rfc3339(since),
    }
    if observed_generation is not None:
        out["observedGeneration"] = int(observed_generation)
    return out


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    status: Status,
    reason: str,
    message: str,
    *,
    now: float,
    observed_generation: int | None = None,
) -> list[dict[str, Any]]:
    """``conditions`` with the one of ``type_`` set; the others unchanged, in their order.

    The condition keeps its ``lastTransitionTime`` when its status is unchanged;
    a new type is appended.
    """
    new = condition(
        type_, status, reason, message, since=now, observed_generation=observed_generation
    )
    out: list[dict[str, Any]] = []
    found = False
    for c in conditions or ():
        if c.get("type") != type_:
            out.append(dict(c))
            continue
        found = True
        if c.get("status") == status and c.get("lastTransitionTime"):
            new["lastTransitionTime"] = c["lastTransitionTime"]
        out.append(new)
    if not found:
        out.append(new)
    return out


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_``, or None."""
    for c in conditions or ():
        if c.get("type") == type_:
            return c
    return None
