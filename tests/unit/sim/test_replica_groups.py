"""The job as torchft replica groups in the simulator (``full+replica-groups``): the job
never restarts after it started, a node fault costs the other groups at most one step,
and the time adds up in the goodput ledger's categories."""

from __future__ import annotations

import pytest

from gpufleet.domain.goodput import CATEGORIES
from gpufleet.sim import simulate
from gpufleet.sim.result import BUCKETS
from gpufleet.sim.scenarios import FULL, PLACEHOLDER, REPLICA_GROUP_FIGURES, REPLICA_GROUPS

GPUS, DAYS, SEED = 1024, 10.0, 2


def test_the_simulator_reports_the_ledgers_categories() -> None:
    assert set(BUCKETS) - {"useful", "checkpoint"} == set(CATEGORIES)


def test_every_figure_of_the_scenario_says_where_it_came_from() -> None:
    model = REPLICA_GROUPS.model()
    assert model.job.replica_groups.enabled
    for key, figure in REPLICA_GROUP_FIGURES.items():
        assert figure.source
        assert REPLICA_GROUPS.overrides[key] == pytest.approx(figure.value)
    assert any(PLACEHOLDER in f.source for f in REPLICA_GROUP_FIGURES.values())


def test_replica_groups_keep_training_through_node_faults() -> None:
    model = REPLICA_GROUPS.model()
    rg = model.job.replica_groups
    r = simulate(model, REPLICA_GROUPS.policy(), gpus=GPUS, days=DAYS, seed=SEED)
    full = simulate(FULL.model(), FULL.policy(), gpus=GPUS, days=DAYS, seed=SEED)
    assert r.wall == pytest.approx(DAYS * 86400.0)
    faults = sum(r.interruptions.values())
    assert faults >= 5, "too few faults to test"
    # One start, never a restart: recovery is the first start plus the groups' rejoins.
    start = model.job.requeue_seconds + model.job.restart_seconds
    share = rg.nodes_per_group / r.job_nodes
    assert r.buckets["recovery"] <= start + faults * 4 * share * (rg.rejoin_seconds + 600)
    # The surviving groups lose at most one step per fault; the rest of redone is SDC.
    assert r.buckets["redone"] <= faults * rg.step_seconds + r.sdc_rollback_hours * 3600 + 1e-6
    assert r.buckets["detection"] < full.buckets["detection"]
    assert r.ettr > full.ettr
