"""A MaintenancePlan's batches are held to every budget that covers their nodes: the pool's,
the fleet's, a node group's and an NVLink domain's (decision 0243)."""

from __future__ import annotations

from gpufleet.domain import maintenance as mt
from gpufleet.domain.states import NodeState

P = mt.NodePhase
ROLLOUT = mt.Rollout(max_unavailable=10, max_per_domain=10)


def tray(name: str, nvlink: str = "", group: str = "", pool: str = "gb200") -> mt.Candidate:
    return mt.Candidate(name, pool, "", NodeState.PRODUCTION, P.PENDING, group=group, nvlink=nvlink)


TRAYS = [tray(f"{d}-{i}", nvlink=d, group="rack") for d in ("nvl-a", "nvl-b") for i in range(3)]


def test_a_batch_takes_no_more_of_an_nvlink_domain_than_its_budget_leaves() -> None:
    room = mt.Room(pools={"gb200": 10}, domains={"nvl-a": 2, "nvl-b": 1})
    batch = mt.next_batch(ROLLOUT, TRAYS, room, now=0.0)
    assert batch.start == ("nvl-a-0", "nvl-a-1", "nvl-b-0")


def test_a_batch_takes_no_more_of_a_group_than_its_budget_leaves() -> None:
    room = mt.Room(pools={"gb200": 10}, groups={"rack": 2})
    assert mt.next_batch(ROLLOUT, TRAYS, room, now=0.0).start == ("nvl-a-0", "nvl-a-1")
    # A node of no group, or of a group without a budget, is not held by it.
    other = [*TRAYS, tray("x0"), tray("y0", group="no-budget")]
    assert mt.next_batch(ROLLOUT, other, room, now=0.0).start == (
        "nvl-a-0",
        "nvl-a-1",
        "x0",
        "y0",
    )


def test_every_budget_holds_at_once_and_the_wait_names_them() -> None:
    room = mt.Room(pools={"gb200": 10}, groups={"rack": 0}, domains={"nvl-a": 5}, fleet=3)
    batch = mt.next_batch(ROLLOUT, TRAYS, room, now=0.0)
    assert batch.start == () and batch.why == "waiting: no budget room in group rack"
    room = mt.Room(pools={"gb200": 10}, domains={"nvl-a": 0, "nvl-b": 0})
    batch = mt.next_batch(ROLLOUT, TRAYS, room, now=0.0)
    assert batch.why == "waiting: no budget room in NVLink domain nvl-a, NVLink domain nvl-b"
    room = mt.Room(pools={"gb200": 10}, domains={"nvl-a": 5, "nvl-b": 5}, fleet=2)
    assert mt.next_batch(ROLLOUT, TRAYS, room, now=0.0).start == ("nvl-a-0", "nvl-a-1")


def test_a_plain_mapping_is_the_pools_room_as_before() -> None:
    batch = mt.next_batch(ROLLOUT, TRAYS, {"gb200": 2}, now=0.0, fleet_room=1)
    assert batch.start == ("nvl-a-0",)
