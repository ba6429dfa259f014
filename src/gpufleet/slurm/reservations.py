"""Maintenance reservations: a MaintenancePlan's window, kept in Slurm by the syncer.

A plan with ``startAt`` (and ``slurmReservation``, on by default) wants Slurm to start
no job on its nodes that would still run when the window opens. Slurm does that with a
maintenance reservation: from its start time no job may use the nodes, and the
scheduler already keeps off them every job whose time limit would cross it. So every
``interval_s`` the syncer compares the reservations the plans want
(:func:`gpufleet.domain.maintenance.wanted_reservation`: the plan's unfinished nodes,
from its start time) with Slurm's reservations named ``gpufleet-maint-*`` and makes
the difference (:func:`~gpufleet.domain.maintenance.reservation_changes`): create,
shrink as nodes finish, delete when the plan is finished or deleted. Reservations of
any other name are never touched.

Failures are logged and the next pass tries again; the plan's own batches do not
depend on the reservation (the drain waits for jobs whatever happens here). A pass
that cannot read the plans or the Slurm node list changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

from pydantic import ValidationError

from gpufleet.api import maintenanceplan as mplan
from gpufleet.clock import SYSTEM_CLOCK, Clock
from gpufleet.domain import maintenance as mt
from gpufleet.kubeapi import ApiError, KubePort, NotFound, custom
from gpufleet.slurm.errors import SlurmError
from gpufleet.slurm.ports import ReservationPort

log = logging.getLogger("gpufleet.slurm.reservations")

PLANS = custom(mplan.PLURAL)


def wanted(plans: list[dict[str, Any]], slurm_nodes: Collection[str]) -> list[mt.Reservation]:
    """The reservations the plans want, on the nodes Slurm knows."""
    out = []
    for body in plans:
        name = str(body["metadata"]["name"])
        if body["metadata"].get("deletionTimestamp"):
            continue
        try:
            spec = mplan.MaintenancePlanSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            continue  # the controller reports an invalid plan; it reserves nothing
        status = body.get("status") or {}
        try:
            phase = mt.PlanPhase(status["phase"]) if status.get("phase") else None
            nodes = {
                str(n["name"]): mt.NodePhase(n.get("phase", mt.NodePhase.PENDING))
                for n in status.get("nodes") or []
                if n.get("name") in slurm_nodes
            }
        except (ValueError, KeyError, TypeError):
            continue
        want = mt.wanted_reservation(
            name,
            start_at=spec.start_at.timestamp() if spec.start_at is not None else None,
            reserve=spec.slurm_reservation,
            phase=phase,
            nodes=nodes,
        )
        if want is not None:
            out.append(want)
    return out


class MaintenanceReservations:
    """One pass with :meth:`reconcile`; :meth:`loop` runs it every ``interval_s``."""

    def __init__(
        self,
        kube: KubePort,
        slurm: ReservationPort,
        *,
        slurm_nodes: Callable[[], Collection[str] | None],
        interval_s: float = 15.0,
        dry_run: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.kube = kube
        self.slurm = slurm
        self.slurm_nodes = slurm_nodes
        """The node names Slurm knows now (None: unknown, and the pass waits)."""
        self.interval_s = interval_s
        self.dry_run = dry_run
        self.clock = clock
        self.ours: set[str] | None = None
        """Our reservations as last read (None: not read yet)."""
        self.writes = 0
        self.no_crd_said = False

    async def reconcile(self) -> list[mt.ReservationChange]:
        """Make Slurm's ``gpufleet-maint-*`` reservations what the plans want."""
        known = self.slurm_nodes()
        if known is None:
            return []
        try:
            plans = (await self.kube.list(PLANS)).items
        except NotFound:
            if not self.no_crd_said:
                log.info("no MaintenancePlan CRD installed: no maintenance reservations")
                self.no_crd_said = True
            plans = []
        want = wanted(plans, known)
        if not want and self.ours == set():
            return []  # nothing wanted, nothing of ours in Slurm when last read
        existing = await self.slurm.reservations()  # ours are picked by reservation_changes
        self.ours = {r.name for r in existing if r.name.startswith(mt.RESERVATION_PREFIX)}
        changes = mt.reservation_changes(want, existing, now=self.clock.now())
        for c in changes:
            r = c.reservation
            log.info(
                "reservation=%s %s%s (%s): %d node(s)",
                r.name,
                c.op,
                " (dry run: not written)" if self.dry_run else "",
                c.why,
                len(r.nodes),
            )
            if self.dry_run:
                continue
            if c.op == "create":
                await self.slurm.create_reservation(r)
                self.ours.add(r.name)
            elif c.op == "update":
                await self.slurm.update_reservation(r, move_start=c.move_start)
            else:
                await self.slurm.delete_reservation(r.name)
                self.ours.discard(r.name)
            self.writes += 1
        return changes

    async def loop(self) -> None:
        while True:
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except (ApiError, SlurmError) as exc:
                self.ours = None  # read Slurm again next time
                log.warning("maintenance reservations not reconciled: %s", exc)
            except Exception:
                self.ours = None
                log.exception("maintenance reservations not reconciled")
            await asyncio.sleep(self.interval_s)
