"""gpufleet_node_state_since_timestamp_seconds names each node under repair and since when,
and only those: the stalled-remediation alert reads it per node."""

from __future__ import annotations

from prometheus_client import generate_latest

from gpufleet.domain.records import NodeRecord
from gpufleet.domain.states import NodeState
from gpufleet.lifecycle.metrics import Metrics


def test_only_nodes_under_repair_are_exported_with_their_entry_time() -> None:
    records = {
        "a": NodeRecord.new("a", at=100.0, state=NodeState.PRODUCTION),
        "b": NodeRecord.new("b", at=200.0, state=NodeState.REMEDIATING),
        "c": NodeRecord.new("c", at=300.0, state=NodeState.TRIAGE),
    }
    metrics = Metrics()
    metrics.count_stays(records)
    sample = metrics.registry.get_sample_value
    name = "gpufleet_node_state_since_timestamp_seconds"
    assert sample(name, {"node": "b", "state": "remediating"}) == 200.0
    assert sample(name, {"node": "a", "state": "production"}) is None
    assert sample(name, {"node": "c", "state": "triage"}) is None
    # Read when scraped: a record that changes is seen at the next scrape, not kept twice.
    records["a"] = NodeRecord.new("a", at=400.0, state=NodeState.DRAINING)
    del records["b"]
    text = generate_latest(metrics.registry).decode()
    assert f'{name}{{node="a",state="draining"}} 400.0' in text
    assert 'node="b"' not in text
