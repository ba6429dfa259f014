"""A line a controller pass repeats every tick is said once a minute, with a count."""

from __future__ import annotations

from gpufleet.domain.repeats import Repeats


def test_the_first_line_passes_repeats_are_swallowed_then_counted() -> None:
    r = Repeats(every_s=60.0)
    key = ("gpu-node-0001", "recorded only: the node is in triage")
    assert r.admit(key, 0.0) == 0
    assert [r.admit(key, float(t)) for t in range(1, 60)] == [None] * 59
    assert r.admit(key, 60.0) == 59  # said again, with how many were swallowed
    assert r.admit(key, 61.0) is None


def test_keys_are_independent_and_the_memory_is_bounded() -> None:
    r = Repeats(every_s=60.0, remember=2)
    assert r.admit("a", 0.0) == 0
    assert r.admit("b", 0.0) == 0
    assert r.admit("a", 1.0) is None
    assert r.admit("c", 1.0) == 0  # evicts the oldest-used key, "b"
    assert r.admit("b", 2.0) == 0  # forgotten: said again at once
    assert r.admit("c", 2.0) is None
