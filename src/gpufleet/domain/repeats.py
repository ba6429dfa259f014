"""When a repeated line is said again: the same words once per interval, with a count.

A controller pass decides about every held node on every tick (about once a
second), and each decision explains itself ("recorded only: the node is in
triage"). Logged every time, one stuck node fills the log. :class:`Repeats`
lets the first occurrence through, swallows the repeats for ``every_s``, then
lets the next one through with the number it swallowed, so the log still says
the node is stuck, and how often it was decided about. Pure: the time is an
argument (any monotonic clock).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(slots=True)
class _Said:
    at: float
    swallowed: int


class Repeats:
    """Per key, at most one line every ``every_s`` seconds; remembers ``remember`` keys."""

    def __init__(self, every_s: float = 60.0, remember: int = 4096) -> None:
        self.every_s = every_s
        self.remember = remember
        self._said: OrderedDict[Hashable, _Said] = OrderedDict()

    def admit(self, key: Hashable, now: float) -> int | None:
        """None: a repeat to swallow. A number: say it now; that many were swallowed since."""
        said = self._said.get(key)
        if said is not None and now - said.at < self.every_s:
            said.swallowed += 1
            self._said.move_to_end(key)
            return None
        swallowed = said.swallowed if said is not None else 0
        self._said[key] = _Said(at=now, swallowed=0)
        self._said.move_to_end(key)
        while len(self._said) > self.remember:
            self._said.popitem(last=False)
        return swallowed
