"""Per-GPU quarantine in the deterministic simulation, and invariant 9.

With ``Config(quarantine=True)`` the FleetPolicy quarantines one GPU for the faults that
allow it (the simulation's XID 48 on a GPU) and takes the node out for its repair a minute
later (:data:`QUARANTINE`, docs/decisions/0233): the quarantine, its held retries, the
drain for the repair (jobs let finish) and the GPU reset through the gate all run under
invariants 1-6, and under:

9. **a quarantine takes nothing out, and only a verified repair ends it**: a controller
   write that adds a quarantined GPU keeps the node in production and sets no cordon
   (9a); a record drops a quarantined GPU only as the node enters production, its repair
   verified (9b).

Not modelled: Slurm's GPU indexes (the simulated Slurm runs whole-node jobs), so which GPU
a new job is given is checked on real daemons (tests/integration/test_gpu_quarantine.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.domain import well_known
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.dst.kube import Write
from gpufleet.kubeapi import NODES

QUARANTINE: Mapping[str, Any] = {"enabled": True, "maxGpusPerNode": 1, "repairAfterSeconds": 60}
"""The simulation's ``gpuQuarantine``: one GPU per node, repaired a minute later."""


def with_quarantine(spec: dict[str, Any]) -> dict[str, Any]:
    """A FleetPolicy spec with :data:`QUARANTINE`."""
    out = copy.deepcopy(spec)
    out["gpuQuarantine"] = dict(QUARANTINE)
    return out


def _cordoned(obj: Mapping[str, Any] | None) -> bool:
    return bool(((obj or {}).get("spec") or {}).get("unschedulable"))


@dataclass
class QuarantineChecks:
    """Invariant 9, checked at every controller write of a Node."""

    fail: Callable[..., None]
    """``fail(invariant, node, text)`` (:meth:`Invariants._fail`)."""
    record_in: Callable[[Mapping[str, Any] | None], NodeRecord | None]
    """The record on a Node body (:func:`gpufleet.dst.invariants.record_in`)."""
    quarantines: int = 0
    """GPUs quarantined in the run (a run that never quarantined proves nothing)."""
    released: int = 0

    def on_write(self, w: Write) -> None:
        if w.resource != str(NODES) or w.identity != well_known.CONTROLLER:
            return
        old, new = self.record_in(w.before), self.record_in(w.after)
        if new is None:
            return
        was = {q.index for q in old.quarantined_gpus} if old is not None else set()
        now = {q.index for q in new.quarantined_gpus}
        if now - was:
            self.quarantines += len(now - was)
            if new.state is not NodeState.PRODUCTION or (
                old is not None and old.state is not NodeState.PRODUCTION
            ):
                self.fail("9a", w.name, f"GPU(s) {sorted(now - was)} quarantined in {new.state}")
            elif _cordoned(w.after) and not _cordoned(w.before):
                self.fail("9a", w.name, f"the quarantine of GPU(s) {sorted(now - was)} cordoned")
        if was - now:
            self.released += len(was - now)
            entered = new.state is NodeState.PRODUCTION and (
                old is not None and old.state is not NodeState.PRODUCTION
            )
            if not entered:
                self.fail(
                    "9b",
                    w.name,
                    f"GPU(s) {sorted(was - now)} released in {new.state} without a verified repair",
                )
