"""Fabric faults judged with their NVLink domain in the deterministic simulation, and
invariant 10.

With :func:`with_domain_faults` (NVLink domains on, and the environment event
``domain-fault``) the agents of one or two trays of a domain log a fabric fault at once
(``nvswitch-fatal``: the switch side, or ``fabric-degraded``), and the fabric heals itself
(the agent's condition clears ``detection.clearAfterSeconds`` later): the controller's
domain judgement (docs/decisions/0240), the trays' hold, the domain's release into
verification and a lone tray's own ladder run under invariants 1-6, and under:

10. **a tray held with its domain is not repaired alone**: no controller write starts a
    ladder step on a tray whose incident holds it for its NVLink domain (10a), and a tray
    leaves the hold only into verification or to people (10b).

The model's switch trays heal by themselves, so what the fault's repair needs (a switch
reset, a replaced tray) is not modelled; its verdict (checks) passes once the fault is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpufleet.domain import domain_faults, well_known
from gpufleet.domain.faults import Evidence, FaultEvent, FaultKind
from gpufleet.domain.states import NodeState
from gpufleet.dst.kube import Write
from gpufleet.kubeapi import NODES

if TYPE_CHECKING:
    from gpufleet.dst.scenario import Config
    from gpufleet.dst.world import World

KINDS = ("nvswitch-fatal", "fabric-degraded")
"""The fabric faults the environment injects."""


def with_domain_faults(cfg: Config, weight: int = 4) -> Config:
    """``cfg`` with NVLink domains and the environment's ``domain-fault``."""
    return replace(cfg, domains=True, weights={**cfg.weights, "domain-fault": weight})


def inject(world: World, trays: tuple[str, ...], kind: str) -> str:
    """The agents of ``trays`` log fabric fault ``kind`` now (the kernel's SXid for
    ``nvswitch-fatal``, the fabric's health for ``fabric-degraded``)."""
    now = world.clock.now()
    fault_kind = FaultKind(kind)
    for node in trays:
        if fault_kind is FaultKind.NVSWITCH_FATAL:
            evidence = Evidence(switch="nvidia-nvswitch0", message="nvidia-nvswitch0: SXid 24007")
        else:
            evidence = Evidence(gpu_index=0, message="GPU 0 fabric health Unhealthy")
        world.hw[node].pending.append(FaultEvent(fault_kind, node, now, evidence=evidence))
    return f"{kind} on {', '.join(trays)}"


_LEAVES = frozenset({NodeState.VERIFYING, NodeState.TRIAGE, NodeState.RMA})
"""Where a held tray may go (10b): verification once its domain is repaired, or people."""


@dataclass
class DomainFaultChecks:
    """Invariant 10, checked at every controller write of a Node."""

    fail: Callable[..., None]
    """``fail(invariant, node, text, **detail)`` (:meth:`Invariants._fail`)."""
    held: int = 0
    """Trays taken into a domain's hold in the run (a run that held none proves nothing)."""
    released: int = 0

    def on_write(self, w: Write) -> None:
        if w.resource != str(NODES) or w.identity != well_known.CONTROLLER:
            return
        from gpufleet.dst.invariants import record_in  # it imports this module

        old, new = record_in(w.before), record_in(w.after)
        if new is None:
            return
        was = old is not None and domain_faults.held(old.incident)
        now = domain_faults.held(new.incident)
        if now and not was:
            self.held += 1
        if now and old is not None and old.incident is not None and new.incident is not None:
            before = (
                len(old.incident.tried) if old.incident.opened_at == new.incident.opened_at else 0
            )
            if len(new.incident.tried) > before:
                self.fail(
                    "10",
                    w.name,
                    f"a ladder step ({new.incident.tried[-1].step}) started on a tray held "
                    f"with NVLink domain {new.nvlink_domain}",
                    category="10a/step-on-a-held-tray",
                )
        if was and not now:
            self.released += 1
            assert old is not None
            moved = new.state is not old.state
            if moved and new.state not in _LEAVES:
                self.fail(
                    "10",
                    w.name,
                    f"left the hold of NVLink domain {old.nvlink_domain} into {new.state}",
                    category="10b/left-the-hold",
                )
