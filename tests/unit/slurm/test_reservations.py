"""The syncer's maintenance reservations pass (gpufleet.slurm.reservations) with an in-memory
Kubernetes and Slurm: what the plans want is created, shrunk and deleted, other reservations
are never touched, dry-run writes nothing, and a cluster without the MaintenancePlan CRD
reserves nothing and stops asking Slurm (the real daemons: test_maintenance_reservation.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufleet.clock import ManualClock
from gpufleet.domain.enrollment import rfc3339
from gpufleet.domain.maintenance import Reservation
from gpufleet.kubeapi import NotFound, ObjectList, Resource
from gpufleet.slurm.reservations import PLANS, MaintenanceReservations

from ..fakes import UnmodelledKube


class PlanKube(UnmodelledKube):
    """Lists MaintenancePlans from ``plans``; ``None``: the CRD is not installed (404)."""

    def __init__(self, plans: list[dict[str, Any]] | None) -> None:
        self.plans = plans
        self.lists = 0

    async def list(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> ObjectList:
        assert resource == PLANS
        self.lists += 1
        if self.plans is None:
            raise NotFound("list maintenanceplans", 404, "404 page not found")
        return ObjectList(list(self.plans), "1")


class FakeReservations:
    """Slurm's reservations in memory; records the writes."""

    def __init__(self, existing: list[Reservation]) -> None:
        self.by_name = {r.name: r for r in existing}
        self.reads = 0
        self.writes: list[tuple[str, str]] = []

    async def reservations(self) -> list[Reservation]:
        self.reads += 1
        return list(self.by_name.values())

    async def create_reservation(self, reservation: Reservation) -> None:
        self.writes.append(("create", reservation.name))
        self.by_name[reservation.name] = reservation

    async def update_reservation(self, reservation: Reservation, *, move_start: bool) -> None:
        self.writes.append(("update", reservation.name))
        self.by_name[reservation.name] = reservation

    async def delete_reservation(self, name: str) -> None:
        self.writes.append(("delete", name))
        del self.by_name[name]


def plan(name: str, start: float, nodes: dict[str, str], phase: str = "Scheduled") -> Any:
    return {
        "metadata": {"name": name},
        "spec": {"nodeSelector": {}, "action": "noop", "startAt": rfc3339(start)},
        "status": {"phase": phase, "nodes": [{"name": n, "phase": p} for n, p in nodes.items()]},
    }


SLURM_NODES = {"n1", "n2", "n3"}
FOREIGN = Reservation("site-hold", 5.0, frozenset({"n3"}))


def make(
    plans: list[dict[str, Any]] | None, *, dry_run: bool = False
) -> tuple[MaintenanceReservations, PlanKube, FakeReservations]:
    kube, slurm = PlanKube(plans), FakeReservations([FOREIGN])
    clock = ManualClock(now=1_000_000.0)
    passes = MaintenanceReservations(
        kube, slurm, slurm_nodes=lambda: SLURM_NODES, dry_run=dry_run, clock=clock
    )
    return passes, kube, slurm


def test_a_window_is_created_shrunk_and_deleted_and_the_site_s_reservation_kept() -> None:
    start = 1_000_000.0 + 3600
    passes, kube, slurm = make(
        [plan("fw", start, {"n1": "Pending", "n2": "Pending", "x": "Pending"})]
    )
    asyncio.run(passes.reconcile())
    assert slurm.writes == [("create", "gpufleet-maint-fw")]
    # A node Slurm does not know is not reserved (scontrol would refuse the whole list).
    assert slurm.by_name["gpufleet-maint-fw"].nodes == {"n1", "n2"}
    assert kube.plans is not None
    kube.plans[0] = plan("fw", start, {"n1": "Succeeded", "n2": "Draining"}, "Progressing")
    asyncio.run(passes.reconcile())
    assert slurm.by_name["gpufleet-maint-fw"].nodes == {"n2"}
    kube.plans[0] = plan("fw", start, {"n1": "Succeeded", "n2": "Failed"}, "Completed")
    asyncio.run(passes.reconcile())
    assert slurm.writes == [
        ("create", "gpufleet-maint-fw"),
        ("update", "gpufleet-maint-fw"),
        ("delete", "gpufleet-maint-fw"),
    ]
    assert slurm.by_name == {"site-hold": FOREIGN}


def test_dry_run_says_what_it_would_do_and_writes_nothing() -> None:
    passes, _, slurm = make([plan("fw", 1_000_000.0 + 60, {"n1": "Pending"})], dry_run=True)
    changes = asyncio.run(passes.reconcile())
    assert [c.op for c in changes] == ["create"] and slurm.writes == []


def test_without_the_crd_nothing_is_reserved_and_slurm_is_read_once() -> None:
    passes, kube, slurm = make(None)
    for _ in range(3):
        assert asyncio.run(passes.reconcile()) == []
    assert kube.lists == 3 and slurm.reads == 1 and slurm.writes == []
    assert passes.no_crd_said
