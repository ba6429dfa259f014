"""Per-GPU quarantine: the record's codec carries the quarantined GPUs."""

from __future__ import annotations

import json
from dataclasses import replace

from gpufleet.domain.records import NodeRecord, QuarantinedGpu, record_from_json, record_to_json


def test_record_round_trips_quarantined_gpus_and_omits_none() -> None:
    plain = NodeRecord.new("n1", at=0.0)
    assert "quarantined_gpus" not in record_to_json(plain)
    out = replace(
        plain,
        quarantined_gpus=(
            QuarantinedGpu(index=3, uuid="GPU-abc", fault="xid-94", since=12.5),
            QuarantinedGpu(index=5, uuid="", fault="row-remap-pending", since=13.0),
        ),
    )
    text = record_to_json(out)
    assert json.loads(text)["quarantined_gpus"][0] == {
        "index": 3,
        "uuid": "GPU-abc",
        "fault": "xid-94",
        "since": 12.5,
    }
    assert record_from_json(text) == out


def test_record_written_before_quarantine_reads_as_none() -> None:
    older = json.loads(record_to_json(NodeRecord.new("n1", at=0.0)))
    assert record_from_json(json.dumps(older)).quarantined_gpus == ()
