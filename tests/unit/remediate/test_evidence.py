"""Did a reset happen? Baselines, evidence, and the write-ahead mark."""

from __future__ import annotations

from gpufleet.remediate.evidence import ActionMark, ResetEvidence, reset_since


def test_last_reset_time_says_yes_and_no() -> None:
    before = ResetEvidence(last_reset_time="2025-01-01T00:00:00Z", power_state="On")
    assert reset_since(before, ResetEvidence(last_reset_time="2025-01-01T00:05:00Z")) is True
    assert reset_since(before, before) is False


def test_a_new_reset_entry_in_the_log_says_yes_but_no_entry_proves_nothing() -> None:
    before = ResetEvidence(log_newest="2025-01-01T00:00:00Z", power_state="On")
    after = ResetEvidence(log_resets=("2025-01-01T00:00:07Z",), power_state="On")
    assert reset_since(before, after) is True
    old = ResetEvidence(log_resets=("2024-12-31T23:00:00Z",), power_state="On")
    assert reset_since(before, old) is None


def test_a_power_change_says_yes_and_nothing_else_says_nothing() -> None:
    before = ResetEvidence(power_state="On")
    assert reset_since(before, ResetEvidence(power_state="Off")) is True
    assert reset_since(before, ResetEvidence(power_state="On")) is None


def test_the_mark_round_trips_and_binds_one_attempt() -> None:
    mark = ActionMark(
        step="power-cycle",
        attempt=2,
        started_at=1712345678.123456,
        reset_type="PowerCycle",
        baseline=ResetEvidence(last_reset_time="t0", power_state="On"),
        posted_at=1712345680.5,
    )
    again = ActionMark.from_json(mark.to_json())
    assert again == mark
    assert mark.binds("power-cycle", 2, 1712345678.123456)
    assert not mark.binds("power-cycle", 1, 1712345678.123456)
    assert not mark.binds("reboot", 2, 1712345678.123456)
    assert not mark.binds("power-cycle", 2, 1712345000.0)


def test_an_unreadable_mark_is_none() -> None:
    assert ActionMark.from_json(None) is None
    assert ActionMark.from_json("{not json") is None
    assert ActionMark.from_json('{"step": "reboot"}') is None


def test_a_force_off_is_judged_by_the_power_state_not_last_reset_time() -> None:
    """A power-off is not a reset: LastResetTime stays; the power state shows it."""
    before = ResetEvidence(last_reset_time="2025-01-01T00:00:00Z", power_state="On")
    off = ResetEvidence(last_reset_time="2025-01-01T00:00:00Z", power_state="Off")
    assert reset_since(before, off) is False  # read as a reset, it never happened
    assert reset_since(before, off, "ForceOff") is True
    assert reset_since(before, before, "ForceOff") is False
    assert reset_since(before, ResetEvidence(last_reset_time="x"), "ForceOff") is True
