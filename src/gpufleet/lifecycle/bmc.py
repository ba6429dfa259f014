"""The controller's side of BMC steps that is not the act: the mark as last seen, the condition.

The act itself (identity, proof, write-ahead mark by compare-and-swap, the one
POST) is the gate's (:mod:`gpufleet.gate`); here are only:

- :func:`mark_of`: the write-ahead mark on a Node as the watch last delivered it
  (to find marks of attempts that ended; the gate reads and verifies marks itself);
- :func:`mismatch_condition`: the ``GpufleetBmcMismatch`` Node condition.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gpufleet.domain import well_known
from gpufleet.kubeapi import NODES, ApiError, KubePort, Patch
from gpufleet.lifecycle import remediations
from gpufleet.remediate.evidence import ActionMark

log = logging.getLogger("gpufleet.controller")


def mark_of(body: Mapping[str, Any] | None) -> ActionMark | None:
    """The write-ahead mark on a Node (unverified: only used to clean it up)."""
    if body is None:
        return None
    ann = body.get("metadata", {}).get("annotations") or {}
    text = ann.get(well_known.ANNOTATION_BMC_ACTION)
    return ActionMark.from_json(str(text)) if text else None


async def mismatch_condition(
    client: KubePort, body: Mapping[str, Any], *, mismatch: bool, message: str, now: float
) -> None:
    """Set ``GpufleetBmcMismatch`` (True: not verified, False: verified again).

    Written only when it changes, so a verified BMC costs no write per step.
    """
    node = str(body["metadata"]["name"])
    conds = body.get("status", {}).get("conditions") or []
    current = next((c for c in conds if c.get("type") == well_known.CONDITION_BMC_MISMATCH), None)
    status = "True" if mismatch else "False"
    if current is None and not mismatch:
        return
    if current is not None and current.get("status") == status and not mismatch:
        return
    stamp = remediations.iso(now)
    cond = {
        "type": well_known.CONDITION_BMC_MISMATCH,
        "status": status,
        "reason": "IdentityMismatch" if mismatch else "IdentityVerified",
        "message": message[:1000],
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": (
            current.get("lastTransitionTime", stamp)
            if current is not None and current.get("status") == status
            else stamp
        ),
    }
    try:
        await client.patch(
            NODES, node, {"status": {"conditions": [cond]}}, status=True, kind=Patch.STRATEGIC
        )
    except ApiError as exc:
        log.warning("node=%s %s not written: %s", node, well_known.CONDITION_BMC_MISMATCH, exc)
