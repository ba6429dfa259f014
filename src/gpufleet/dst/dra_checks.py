"""DRA device taints in the deterministic simulation, and invariant 13.

With ``Config(device_taints=True)`` the controllers run their DeviceTaints collaborator
(:mod:`gpufleet.lifecycle.device_taints`, decision 0239): every GPU a record quarantines
(``Config(quarantine=True)``, invariant 9) gets one DeviceTaintRule, deleted when the
quarantine ends; with restarts, lost leases, late and lost replies. A rule evicts the
pods on its GPU, so it must follow the records exactly:

13. **a device taint follows a quarantine, and only gpufleet's rules are touched**: a
    controller write that creates or changes a rule names a GPU the node's record
    quarantines at that moment, and carries gpufleet's label (13a); a controller deletes
    or changes only rules that carry gpufleet's label (13b).

Not modelled: the pods a rule evicts (kube-controller-manager's device taint eviction
controller), checked on the real components (tests/integration/test_dra_gpu_taints.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.api import dra as dra_codec
from gpufleet.domain import dra, well_known
from gpufleet.domain.records import NodeRecord
from gpufleet.dst.kube import ApiServer, Write
from gpufleet.kubeapi import NODES
from gpufleet.kubeapi.resources import DEVICE_TAINT_RULES


def _ours(obj: Mapping[str, Any] | None) -> bool:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(well_known.LABEL_MANAGED_BY) == dra.MANAGED_BY


@dataclass
class DeviceTaintChecks:
    """Invariant 10, checked at every write of a DeviceTaintRule."""

    fail: Callable[..., None]
    """``fail(invariant, node, text)`` (:meth:`Invariants._fail`)."""
    api: ApiServer
    record_in: Callable[[Mapping[str, Any] | None], NodeRecord | None]
    created: int = 0
    """Rules a controller created in the run (a run that made none proves nothing)."""
    deleted: int = 0

    def on_write(self, w: Write) -> None:
        if w.resource != str(DEVICE_TAINT_RULES):
            return
        if w.identity != well_known.CONTROLLER:
            return
        if w.before is not None and not _ours(w.before):
            self.fail(
                "13b", w.name, f"a controller {w.verb} of DeviceTaintRule {w.name}, not gpufleet's"
            )
            return
        if w.after is None:
            self.deleted += 1
            return
        rule = dra_codec.read_rule(w.after)
        if rule is None or rule.driver != dra.DRIVER:
            self.fail(
                "13a", w.name, f"DeviceTaintRule {w.name} written not as gpufleet's: {w.after}"
            )
            return
        record = self.record_in(self.api.find(NODES, rule.node))
        quarantined = {q.index for q in record.quarantined_gpus} if record is not None else set()
        if rule.index not in quarantined:
            self.fail(
                "13a",
                rule.node,
                f"DeviceTaintRule {w.name} written for GPU {rule.index}, which the record does"
                f" not quarantine (quarantined: {sorted(quarantined)})",
            )
            return
        self.created += w.before is None
