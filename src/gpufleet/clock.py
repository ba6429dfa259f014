"""The one way the products read time: a ``Clock`` handed to them, never ``time`` itself.

Two readings, because they answer different questions: ``now()`` is wall time
(seconds since the epoch) for what is stored or shown — a record's ``since``,
a condition's ``lastTransitionTime``, a token's expiry — and can jump when the
host's clock is set; ``monotonic()`` never jumps and is what a duration, a
timeout or a token bucket is measured on, within one process.

``domain`` reads no clock (``now`` is an argument of every decision), so this
module sits below the products and above ``domain`` in the layers; a test
injects a :class:`ManualClock` and moves time itself instead of sleeping.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Where a product reads the time."""

    def now(self) -> float:
        """Wall time, seconds since the epoch (may jump when the host's clock is set)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back; only differences mean anything."""
        ...


class SystemClock:
    """The host's clocks: ``time.time`` and ``time.monotonic``."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


SYSTEM_CLOCK: Clock = SystemClock()
"""The default every product uses in production."""


class ManualClock:
    """A clock that moves only when told to (tests, and replaying recorded runs).

    Both readings move together on :meth:`advance`; :meth:`set` moves wall time
    alone, the way an administrator (or NTP) setting the host's clock would.
    """

    def __init__(self, now: float = 1_000_000.0, monotonic: float = 1_000.0) -> None:
        self._now = now
        self._monotonic = monotonic

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass (never backwards: a monotonic clock cannot)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back {seconds} s; use set() for wall time")
        self._now += seconds
        self._monotonic += seconds

    def set(self, now: float) -> None:
        """Set wall time alone (monotonic time is not affected by a clock change)."""
        self._now = now
