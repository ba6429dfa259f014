"""The manual clock moves only when told to, and never backwards on its monotonic side."""

from __future__ import annotations

import pytest

from gpufleet.clock import SYSTEM_CLOCK, Clock, ManualClock


def test_manual_clock_moves_both_readings_together() -> None:
    clock = ManualClock(now=100.0, monotonic=5.0)
    clock.advance(2.5)
    assert (clock.now(), clock.monotonic()) == (102.5, 7.5)


def test_setting_wall_time_leaves_monotonic_time_alone() -> None:
    clock = ManualClock(now=100.0, monotonic=5.0)
    clock.set(50.0)
    assert (clock.now(), clock.monotonic()) == (50.0, 5.0)


def test_manual_clock_refuses_to_go_back() -> None:
    with pytest.raises(ValueError, match="cannot go back"):
        ManualClock().advance(-1)


def test_system_clock_reads_the_host() -> None:
    import time

    clock: Clock = SYSTEM_CLOCK
    assert abs(clock.now() - time.time()) < 60
    a = clock.monotonic()
    assert clock.monotonic() >= a
