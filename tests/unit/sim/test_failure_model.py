"""The default failure model against its source, and the model file's validation."""

from __future__ import annotations

import math

import pytest

from gpufleet.domain.policy import default_policy
from gpufleet.sim import simulate
from gpufleet.sim.model import ModelError, default_model, default_model_text, load_model

LLAMA3_UNEXPECTED = 419  # 16,384 GPUs, 54 days [L3 Table 5]
LLAMA3_PLANNED = 47


def test_default_model_reproduces_the_llama3_interruption_count() -> None:
    """Faults on the job's 2,048 nodes in 54 days: 419 unexpected, 47 planned.

    Poisson counts: the tolerance is 4 standard deviations of the summed count.
    Stragglers are not in the source's table and are left out of the sum.
    """
    seeds = (1, 2)
    runs = [simulate(default_model(), default_policy(), gpus=16384, days=54, seed=s) for s in seeds]
    unexpected = sum(n for r in runs for name, n in r.job_incidents.items() if name != "straggler")
    planned = sum(r.interruptions.get("planned", 0) for r in runs)
    want = LLAMA3_UNEXPECTED * len(seeds)
    assert abs(unexpected - want) <= 4 * math.sqrt(want), unexpected
    want_planned = LLAMA3_PLANNED * len(seeds)
    assert abs(planned - want_planned) <= 4 * math.sqrt(want_planned), planned


def test_same_seed_same_run_other_seed_other_run() -> None:
    a = simulate(default_model(), default_policy(), gpus=1024, days=10, seed=7)
    b = simulate(default_model(), default_policy(), gpus=1024, days=10, seed=7)
    c = simulate(default_model(), default_policy(), gpus=1024, days=10, seed=8)
    assert a.to_dict(timeline=True) == b.to_dict(timeline=True)
    assert a.to_dict() != c.to_dict()


def test_buckets_add_up_to_the_horizon() -> None:
    r = simulate(default_model(), default_policy(), gpus=3504, days=7, seed=2)
    assert r.wall == pytest.approx(7 * 86400.0)
    assert all(v >= 0 for v in r.buckets.values())
    assert 0.5 < r.ettr < 1.0


def _bad(old: str, new: str) -> str:
    text = default_model_text()
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("old", "new", "where", "words"),
    [
        (
            "blockingSeconds: 10",
            "blockingSeconds: -1",
            "job.checkpoint.blockingSeconds",
            "greater than or equal to 0",
        ),
        (
            "cure: {gpu-reset: 0.85, rma: 0.15}",
            "cure: {gpu-reset: 0.85, rma: 0.5}",
            "failures.categories[1]",
            "sum to 1",
        ),
        ("xid: 79", "xid: 7979", "failures.categories[0]", "unknown XID 7979"),
        ("fault: ib-port-down", "fault: ib-port-dwn", "failures.categories[3].fault", "ib-port"),
        ("passiveSeconds: 30", "passiveSecs: 30", "detection.passiveSecs", "not permitted"),
        ("rmaSeconds: 172800", "rmaSeconds: soon", "remediation.rmaSeconds", "valid number"),
    ],
)
def test_a_bad_model_names_the_field_and_line(old: str, new: str, where: str, words: str) -> None:
    text = _bad(old, new)
    with pytest.raises(ModelError) as err:
        load_model(text, "fleet.yaml")
    msg = str(err.value)
    # A whole-category problem points at the category's first line.
    anchor = "name: gpu-hbm" if "sum to 1" in words else new
    line = next(n for n, t in enumerate(text.splitlines(), 1) if anchor in t)
    assert "fleet.yaml" in msg
    assert f"{where}" in msg
    assert words in msg
    assert f"line {line}:" in msg


def test_a_model_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ModelError, match="must be a YAML mapping"):
        load_model("- 1\n- 2\n")
    with pytest.raises(ModelError, match="not valid YAML"):
        load_model("fleet: [\n")


def test_overrides_address_categories_by_name_and_are_validated() -> None:
    from gpufleet.sim.scenarios import with_overrides

    m = with_overrides(default_model(), {"failures.categories.sdc.symptom_mean_seconds": 60.0})
    assert next(c for c in m.failures.categories if c.name == "sdc").symptom_mean_seconds == 60
    with pytest.raises(KeyError, match="no such model field"):
        with_overrides(default_model(), {"job.restart_secs": 1})
    with pytest.raises(ValueError, match="restart_seconds"):
        with_overrides(default_model(), {"job.restart_seconds": -1})


def test_memory_does_not_grow_with_simulated_time() -> None:
    """Eight times the days, not eight times the memory: state is per node, not per event.

    Nodes that have had an incident hold a few more small objects, so the peak still rises
    (about 1.4x here) until every node has had one; keeping, say, every decision's record
    instead would more than double it.
    """
    import tracemalloc

    simulate(default_model(), default_policy(), gpus=2048, days=5, seed=1)  # warm caches

    def peak(days: float) -> int:
        tracemalloc.start()
        simulate(default_model(), default_policy(), gpus=2048, days=days, seed=3)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    short, long = peak(15), peak(120)
    assert long < 2.0 * short, (short, long)


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        (
            "{name: nccl-hang, rate: 0.063, effect: hang, scope: node, lemon: false,\n"
            "       cure: {restart-job: 1.0}}",
            "{name: nccl-hang, rate: 0.063, effect: hang, scope: node, lemon: false,\n"
            "       cure: {reboot: 1.0}}",
            "needs 'fault' or 'xid'",
        ),
        ("       cure: {rma: 1.0}}", "       cure: {restart-job: 1.0}}", "not cured by a job"),
    ],
)
def test_a_category_the_simulator_could_not_report_is_refused(
    old: str, new: str, words: str
) -> None:
    with pytest.raises(ModelError, match=words):
        load_model(_bad(old, new))
