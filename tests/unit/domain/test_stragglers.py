"""Straggler detection from job telemetry (gpufleet.domain.stragglers)."""

from __future__ import annotations

import json
import statistics

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.policy import default_policy, load_policy
from gpufleet.domain.stragglers import (
    NodePace,
    StepSample,
    StragglerRule,
    compare_nodes,
    due,
    is_straggler,
    parse_sample,
    sample_line,
)

RULE = StragglerRule(slower_than=1.08, window_steps=10)


def find_stragglers(samples: list[StepSample], rule: StragglerRule) -> list[NodePace]:
    """The nodes the agent would report: compared with their peers, and slow enough."""
    return [p for p in compare_nodes(samples, rule.window_steps) if is_straggler(p, rule)]


def run(
    paces: dict[str, float], steps: int, *, ranks_per_node: int = 1, job: str = "42"
) -> list[StepSample]:
    """Samples of one run: every rank of every node reports every step at its pace."""
    out = []
    for step in range(1, steps + 1):
        rank = 0
        for node, pace in paces.items():
            for _ in range(ranks_per_node):
                out.append(StepSample(job, 0, rank, node, step, pace, 1000.0 + step))
                rank += 1
    return out


def test_a_node_twice_as_slow_as_its_peer_is_found() -> None:
    found = find_stragglers(run({"a": 0.5, "b": 1.0}, 12), RULE)
    assert [(s.node, round(s.slowdown, 2)) for s in found] == [("b", 2.0)]
    s = found[0]
    assert (s.run_id, s.peers, s.first_step, s.last_step) == ("42.0", 1, 3, 12)
    assert "2.00x" in s.describe() and "job 42.0" in s.describe()


def test_nothing_before_the_window_is_full() -> None:
    assert find_stragglers(run({"a": 0.5, "b": 1.0}, 9), RULE) == []


def test_one_node_has_no_peer_to_compare_with() -> None:
    assert find_stragglers(run({"a": 0.5}, 50, ranks_per_node=4), RULE) == []


def test_equal_nodes_and_slightly_slower_nodes_are_not_stragglers() -> None:
    assert find_stragglers(run({"a": 0.5, "b": 0.5, "c": 0.5}, 20), RULE) == []
    assert find_stragglers(run({"a": 0.50, "b": 0.50, "c": 0.52}, 20), RULE) == []


def test_the_median_ignores_a_few_slow_steps() -> None:
    samples = run({"a": 0.5, "b": 0.5}, 20)
    # Node b saves a checkpoint on 3 of the last 10 steps: 4 s each.
    samples = [
        StepSample(s.job, s.run, s.rank, s.node, s.step, 4.0, s.at)
        if s.node == "b" and s.step in (12, 15, 18)
        else s
        for s in samples
    ]
    assert find_stragglers(samples, RULE) == []


def test_a_node_is_as_slow_as_its_slowest_rank() -> None:
    samples = run({"a": 0.5, "b": 0.5, "c": 0.5}, 12, ranks_per_node=8)
    # One GPU of node c (rank 21) runs at two thirds of the speed.
    samples = [
        StepSample(s.job, s.run, s.rank, s.node, s.step, 0.75, s.at) if s.rank == 21 else s
        for s in samples
    ]
    found = find_stragglers(samples, RULE)
    assert [(s.node, s.slowdown) for s in found] == [("c", 1.5)]


def test_only_steps_every_rank_reported_count() -> None:
    samples = run({"a": 0.5, "b": 1.0}, 10)
    # Step 11 only from rank 0: not complete, so the window is still steps 1-10.
    samples.append(StepSample("42", 0, 0, "a", 11, 0.5, 2000.0))
    found = find_stragglers(samples, RULE)
    assert [(s.node, s.last_step) for s in found] == [("b", 10)]


def test_with_many_nodes_the_slow_one_is_compared_with_the_rest() -> None:
    paces = {f"n{i}": 0.5 for i in range(15)} | {"slow": 0.6}
    found = find_stragglers(run(paces, 10), RULE)
    assert [(s.node, round(s.slowdown, 2), s.peers) for s in found] == [("slow", 1.2, 15)]


@given(
    paces=st.lists(st.floats(0.01, 10.0), min_size=2, max_size=6),
    scale=st.floats(0.1, 10.0),
)
def test_scaling_every_pace_finds_the_same_nodes(paces: list[float], scale: float) -> None:
    named = {f"n{i}": p for i, p in enumerate(paces)}
    a = {s.node for s in find_stragglers(run(named, 10), RULE)}
    b = {s.node for s in find_stragglers(run({k: v * scale for k, v in named.items()}, 10), RULE)}
    # Rounding can move a ratio across the threshold only when it is on it.
    ratios = {
        n: p / statistics.median(q for m, q in named.items() if m != n) for n, p in named.items()
    }
    if all(abs(r - RULE.slower_than) > 1e-6 for r in ratios.values()):
        assert a == b
    assert len(a) < len(named)  # never every node


def test_a_line_round_trips() -> None:
    s = StepSample("1234", 2, 3, "gpu-node-0007", 118, 0.412, 1763700000.12)
    line = sample_line(s)
    assert json.loads(line)["v"] == 1
    assert parse_sample(line) == s
    assert s.run_id == "1234.2"


@pytest.mark.parametrize(
    "line",
    [
        "",
        "{",  # a half-written last line
        "[]",
        '{"v": 2, "job": "1", "run": 0, "rank": 0, "node": "a", "step": 1, '
        '"compute_s": 0.1, "t": 1}',
        '{"v": 1, "job": "1", "run": 0, "rank": 0, "node": "a", "step": 1, "t": 1}',
        '{"v": 1, "job": "../etc", "run": 0, "rank": 0, "node": "a", "step": 1, '
        '"compute_s": 0.1, "t": 1}',
        '{"v": 1, "job": "1", "run": 0, "rank": -1, "node": "a", "step": 1, '
        '"compute_s": 0.1, "t": 1}',
        '{"v": 1, "job": "1", "run": 0, "rank": 0, "node": "a", "step": 1, '
        '"compute_s": NaN, "t": 1}',
        '{"v": 1, "job": "1", "run": 0, "rank": 0, "node": "", "step": 1, '
        '"compute_s": 0.1, "t": 1}',
        '{"v": 1, "job": "1", "run": "x", "rank": 0, "node": "a", "step": 1, '
        '"compute_s": 0.1, "t": 1}',
    ],
)
def test_lines_that_are_not_telemetry_are_skipped(line: str) -> None:
    assert parse_sample(line) is None


def test_reports_are_spaced_by_the_policy_interval() -> None:
    assert due(None, 100.0, 1800)
    assert not due(100.0, 1000.0, 1800)
    assert due(100.0, 1900.0, 1800)


def test_the_policy_carries_the_rule_and_rejects_nonsense() -> None:
    p = default_policy()
    rule = p.detection.stragglers.rule()
    assert rule == StragglerRule(slower_than=1.08, window_steps=50)
    assert p.detection.stragglers.report_every_seconds == 1800
    text = p.model_dump(by_alias=True, mode="json")
    text["detection"]["stragglers"]["slowerThan"] = 0.9
    with pytest.raises(ValueError, match="slowerThan"):
        load_policy(yaml.safe_dump(text), "p.yaml")
