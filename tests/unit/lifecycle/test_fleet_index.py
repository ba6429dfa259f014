"""The fleet's running counts and tick index agree with a pass over every record, whatever
sequence of puts and removals produced them (the tick and the gauges read only these)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from gpufleet.domain.faults import FaultEvent, FaultKind
from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle.fleet import QUIET, Fleet


def _ticked_by_scan(fleet: Fleet) -> set[str]:
    """What the tick looked at when it passed over every record."""
    return {
        name
        for name, r in fleet.records.items()
        if r.state not in QUIET or r.pending is not None or r.state is NodeState.PROVISIONING
    }


def test_counts_and_tick_index_match_a_full_scan_after_random_changes() -> None:
    rng = random.Random(7)
    fleet = Fleet()
    names = [f"n{i}" for i in range(40)]
    states = list(NodeState)
    for _ in range(2000):
        name = rng.choice(names)
        if rng.random() < 0.1:
            fleet.forget(name)
        else:
            record = NodeRecord.new(name, at=0.0, state=rng.choice(states))
            if rng.random() < 0.2:
                record = replace(record, pending=FaultEvent(FaultKind.XID, name, at=1.0, xid=79))
            fleet.put(record)
        assert fleet.states() == Counter(r.state for r in fleet.records.values())
        assert {name for name, _ in fleet.ticking()} == _ticked_by_scan(fleet)
        assert all(fleet.records[name] is r for name, r in fleet.ticking())


def test_a_quiet_fleet_gives_the_tick_nothing_and_a_fault_puts_the_node_back() -> None:
    fleet = Fleet()
    for i in range(100):
        fleet.put(NodeRecord.new(f"n{i}", at=0.0, state=NodeState.PRODUCTION))
    assert fleet.ticking() == []
    draining = NodeRecord.new("n5", at=1.0, state=NodeState.DRAINING)
    fleet.put(draining)
    assert fleet.ticking() == [("n5", draining)]
    fleet.put(NodeRecord.new("n5", at=2.0, state=NodeState.PRODUCTION))
    assert fleet.ticking() == []


def test_generation_moves_only_when_a_record_changes() -> None:
    fleet = Fleet()
    record = NodeRecord.new("n1", at=0.0, state=NodeState.PRODUCTION)
    fleet.put(record)
    seen = fleet.generation
    fleet.put(record)  # the same record again (a heartbeat's watch event)
    assert fleet.generation == seen
    fleet.put(replace(record, state=NodeState.DRAINING))
    assert fleet.generation == seen + 1
    fleet.forget("n1")
    assert fleet.generation == seen + 2
