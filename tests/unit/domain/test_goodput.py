"""The goodput ledger: each lost GPU-second charged once, to one incident and one category."""

from __future__ import annotations

import json

import pytest

from gpufleet.domain import goodput
from gpufleet.domain.goodput import CATEGORIES, Incident, Progress, incident_of, ledger


def steps(
    training: str, rank: int, node: str, first: int, last: int, t0: float, group: str = "g0"
) -> list[Progress]:
    """Steps first..last of one rank, one per second, the first at t0."""
    return [
        Progress(training, rank, node, s, t0 + (s - first), group) for s in range(first, last + 1)
    ]


def balanced(led: goodput.Ledger) -> None:
    for t in led.trainings:
        assert t.productive + sum(t.lost.values()) == pytest.approx(t.allocated)
        assert sum(sum(v.values()) for v in t.by_incident.values()) == pytest.approx(
            sum(t.lost.values())
        )


def test_a_training_without_incidents_is_all_productive() -> None:
    lines = steps("t", 0, "n0", 1, 100, 1.0) + steps("t", 1, "n1", 1, 100, 1.0)
    led = ledger(lines, [])
    (t,) = led.trainings
    assert t.allocated == pytest.approx(200.0)
    assert t.productive == pytest.approx(200.0)
    assert t.goodput == pytest.approx(1.0)
    balanced(led)


def test_a_replica_group_replaced_costs_detection_isolation_and_recovery() -> None:
    # Group g1 on n1 stops after step 40 (t=40); reported at 50, out at 55; the
    # replacement on n9 rejoins and finishes step 71 at t=71 (it copied the weights).
    survivor = steps("t", 0, "n0", 1, 100, 1.0, "g0")
    lost = steps("t", 1, "n1", 1, 40, 1.0, "g1") + steps("t", 1, "n9", 71, 100, 71.0, "g1")
    inc = Incident("n1-1", "n1", "xid-79", reported=50.0, out=55.0, back=500.0)
    led = ledger(survivor + lost, [inc])
    (t,) = led.trainings
    assert t.lost["detection"] == pytest.approx(10.0)
    assert t.lost["isolation"] == pytest.approx(5.0)
    assert t.lost["recovery"] == pytest.approx(15.0)
    assert t.lost["redone"] == 0 and t.lost["degraded"] == 0
    (row,) = led.incidents
    assert row.trainings == ("t",) and row.total == pytest.approx(30.0)
    assert t.groups == 2
    balanced(led)


def test_a_job_without_groups_stops_and_reloads_recovery_and_redone() -> None:
    # One rank per node, two nodes; the job stops after step 50 (t=50) when n1 fails,
    # is reported at 60 and requeued at 70; run 1 starts again at t=100 from the
    # checkpoint of step 40: steps 41..50 are computed twice.
    run0 = steps("job", 0, "n0", 1, 50, 1.0, "") + steps("job", 1, "n1", 1, 50, 1.0, "")
    run1 = steps("job", 0, "n0", 41, 100, 101.0, "") + steps("job", 1, "n2", 41, 100, 101.0, "")
    inc = Incident("n1-1", "n1", "xid-79", reported=60.0, out=70.0, back=900.0)
    led = ledger(run0 + run1, [inc])
    (t,) = led.trainings
    # Each rank: gap [50, 100] (then the step to 101): 10 detection, 10 isolation, 30 recovery.
    assert t.lost["detection"] == pytest.approx(20.0)
    assert t.lost["isolation"] == pytest.approx(20.0)
    assert t.lost["recovery"] == pytest.approx(60.0)
    assert t.lost["redone"] == pytest.approx(2 * 10.0)
    assert t.by_incident["n1-1"]["redone"] == pytest.approx(20.0)
    balanced(led)


def test_an_incident_on_a_node_without_a_job_costs_nothing() -> None:
    lines = steps("t", 0, "n0", 1, 100, 1.0)
    inc = Incident("idle-1", "idle", "xid-79", reported=20.0, out=21.0, back=80.0)
    led = ledger(lines, [inc])
    (row,) = led.incidents
    assert row.total == 0.0 and row.trainings == ()
    assert led.trainings[0].goodput == pytest.approx(1.0)


def test_a_group_that_never_comes_back_is_degraded_until_the_end() -> None:
    survivor = steps("t", 0, "n0", 1, 100, 1.0, "g0")
    gone = steps("t", 1, "n1", 1, 30, 1.0, "g1")
    inc = Incident("n1-1", "n1", "ecc", reported=35.0, out=40.0, back=None)
    led = ledger(survivor + gone, [inc])
    (t,) = led.trainings
    assert t.lost["detection"] == pytest.approx(5.0)
    assert t.lost["isolation"] == pytest.approx(5.0)
    assert t.lost["degraded"] == pytest.approx(60.0)
    assert t.lost["recovery"] == 0.0
    balanced(led)


def test_overlapping_incidents_charge_each_second_once() -> None:
    # Both nodes of group g1 fail; two incidents overlap in time. The group's two
    # ranks are charged once each, each to the incident on its own node.
    survivor = steps("t", 0, "n0", 1, 100, 1.0, "g0") + steps("t", 1, "n1", 1, 100, 1.0, "g0")
    g1 = (
        steps("t", 2, "n2", 1, 40, 1.0, "g1")
        + steps("t", 3, "n3", 1, 40, 1.0, "g1")
        + steps("t", 2, "n8", 71, 100, 71.0, "g1")
        + steps("t", 3, "n9", 71, 100, 71.0, "g1")
    )
    a = Incident("n2-1", "n2", "xid-79", reported=45.0, out=50.0, back=200.0)
    b = Incident("n3-1", "n3", "xid-48", reported=47.0, out=52.0, back=200.0)
    c = Incident("n2-2", "n2", "xid-79", reported=48.0, out=60.0, back=300.0)
    led = ledger(survivor + g1, [a, b, c])
    (t,) = led.trainings
    assert sum(t.lost.values()) == pytest.approx(2 * 30.0)
    totals = {row.incident.name: row.total for row in led.incidents}
    assert totals == pytest.approx({"n2-1": 30.0, "n3-1": 30.0, "n2-2": 0.0})
    assert sum(totals.values()) == pytest.approx(sum(t.lost.values()))
    balanced(led)


def test_a_late_rank_without_an_incident_is_degraded() -> None:
    lines = steps("t", 0, "n0", 1, 100, 1.0) + steps("t", 1, "n1", 21, 100, 21.0)
    led = ledger(lines, [])
    (t,) = led.trainings
    assert t.lost["degraded"] == pytest.approx(20.0)
    assert t.by_incident == {"": {**dict.fromkeys(CATEGORIES, 0.0), "degraded": 20.0}}
    balanced(led)


def test_progress_of_reads_a_line_through_the_telemetry_codec() -> None:
    base = {"v": 1, "job": "tr", "run": 1, "rank": 3, "node": "n1", "step": 7, "compute_s": 0.1}
    p = goodput.progress_of(json.dumps({**base, "t": 5.0, "loss": 1.0}))
    assert p is not None
    assert (p.training, p.rank, p.node, p.step, p.at) == ("tr", 3, "n1", 7, 5.0)
    grouped = goodput.progress_of(json.dumps({**base, "t": 6.0, "group": "g-1"}))
    assert grouped is not None and grouped.group == "g-1" and p.group == ""
    assert goodput.progress_of("{half") is None
    assert goodput.progress_of(json.dumps({**base, "t": "later"})) is None


def test_incident_of_a_noderemediation() -> None:
    doc = {
        "metadata": {"name": "n1-1000"},
        "spec": {"node": "n1", "fault": "xid-79"},
        "status": {
            "startedAt": "1970-01-01T00:00:10.000Z",
            "steps": [{"step": "gpu-reset", "startedAt": "1970-01-01T00:00:25.500Z"}],
            "completedAt": "1970-01-01T00:01:00.000Z",
        },
    }
    assert incident_of(doc) == Incident("n1-1000", "n1", "xid-79", 10.0, 25.5, 60.0)
    assert incident_of({"spec": {"node": "n1"}, "status": {}}) is None
    still = incident_of({**doc, "status": {"startedAt": "1970-01-01T00:00:10Z"}})
    assert still is not None and still.out is None and not still.closed
