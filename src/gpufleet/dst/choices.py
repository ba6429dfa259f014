"""The scheduler's choices: drawn from a seed, recorded, replayed, shrunk.

Every nondeterministic decision of a run that is not an environment event (how
long a call takes, whether its answer is lost, whether its caller dies at that
await, how late a watch event arrives) is one integer drawn here. A run is then
fully described by its seed, its environment events and this list, so:

* a seed's run records the list it drew;
* a replay reads the list back instead of drawing (same list, same run);
* a shrink replaces entries with 0, the default choice (the call answers on time,
  nothing is lost, nobody dies), and reruns: the shorter and duller the list that
  still fails, the easier the failure is to read. Past the end of a replayed list
  every choice is the default.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Odds:
    """How often each kind of trouble is drawn (per call), out of 10,000."""

    slow: int = 900
    """A call that takes long (0.1 to 5 s)."""
    error: int = 60
    """No answer and no effect (Unreachable, SlurmUnavailable, BmcUnreachable)."""
    lost: int = 60
    """The effect happened, the answer was lost."""
    crash: int = 15
    """The caller's process dies at this await (half before, half after the effect)."""
    duplicate: int = 20
    """A write applied twice (a retransmission)."""
    watch_late: int = 800
    """A watch event delivered late (0.05 to 3 s)."""
    watch_drop: int = 20
    """A watch stream ends (the client lists again)."""


class Choice:
    """Names of the values a call's choice can take (0 is always the default)."""

    DEFAULT = 0
    SLOW_1 = 1
    SLOW_2 = 2
    SLOW_3 = 3
    ERROR = 4
    LOST = 5
    CRASH_BEFORE = 6
    CRASH_AFTER = 7
    DUPLICATE = 8


LATENCY: dict[int, float] = {0: 0.002, 1: 0.1, 2: 1.0, 3: 5.0}
"""Seconds a call takes (both ways), by its choice; any other choice: the default."""


WATCH_DELAY = {0: 0.0, 1: 0.05, 2: 0.5, 3: 3.0, 4: 0.0}
"""Seconds a watch event is late, by its choice."""


class ChoiceSource:
    """Draws (and records) or replays the run's choices, one integer per question."""

    def __init__(
        self, seed: int, *, replay: list[int] | None = None, odds: Odds | None = None
    ) -> None:
        self._rng = random.Random(f"choices-{seed}")
        self._replay = replay
        self.odds = odds or Odds()
        self.drawn: list[int] = []
        """Every choice made, in order (what a replay reads back)."""

    def _next(self, draw: int) -> int:
        if self._replay is not None:
            i = len(self.drawn)
            value = self._replay[i] if i < len(self._replay) else 0
        else:
            value = draw
        self.drawn.append(value)
        return value

    def call(self, *, crashable: bool = True, writes: bool = False) -> int:
        """The choice for one call through a port (see :class:`Choice`)."""
        if self._replay is not None:
            # A shrunk list may hand this question a value drawn for another kind of
            # question: anything that is not a call's choice is the default.
            value = self._next(0)
            return value if 0 <= value <= Choice.DUPLICATE else 0
        o = self.odds
        r = self._rng.randrange(10_000)
        value = Choice.DEFAULT
        for limit, v in (
            (o.crash if crashable else 0, Choice.CRASH_BEFORE if r % 2 else Choice.CRASH_AFTER),
            (o.error, Choice.ERROR),
            (o.lost, Choice.LOST),
            (o.duplicate if writes else 0, Choice.DUPLICATE),
            (o.slow, (Choice.SLOW_1, Choice.SLOW_2, Choice.SLOW_3)[r % 3]),
        ):
            if r < limit:
                value = v
                break
            r -= limit
        return self._next(value)

    def watch(self) -> int:
        """The choice for one watch event: 0 on time, 1-3 late, 4 the stream ends after it."""
        if self._replay is not None:
            value = self._next(0)
            return value if value in WATCH_DELAY else 0
        o = self.odds
        r = self._rng.randrange(10_000)
        if r < o.watch_drop:
            return self._next(4)
        r -= o.watch_drop
        if r < o.watch_late:
            return self._next(1 + r % 3)
        return self._next(0)

    def pick(self, n: int) -> int:
        """One of ``n`` (0 when replaying past the recorded list)."""
        if self._replay is not None:
            return self._next(0) % max(n, 1)
        return self._next(self._rng.randrange(n) if n > 1 else 0)
