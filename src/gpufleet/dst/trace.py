"""The trace of a run: one line per call through a port, environment event and verdict.

A line is (virtual time, process, call, outcome). Two runs are the same run when
their traces are equal byte for byte (:meth:`Trace.digest`), which is what the
determinism test compares. The full trace of a soak is long; :meth:`Trace.story`
keeps the lines a person reads first (environment events, crashes, writes to
Slurm, the BMC and gpufleet's Node state, verdicts).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Line:
    at: float
    proc: str
    call: str
    outcome: str
    key: bool = False
    """Part of the story (see :meth:`Trace.story`)."""

    def text(self) -> str:
        return f"{self.at:10.3f}  {self.proc:<14} {self.call}  -> {self.outcome}"


class Trace:
    """Lines in the order they happened."""

    def __init__(self, now: Callable[[], float], *, keep: bool = True) -> None:
        self._now = now
        self._keep = keep
        self.lines: list[Line] = []
        self._hash = hashlib.sha256()
        self.count = 0

    def add(self, proc: str, call: str, outcome: str, *, key: bool = False) -> None:
        line = Line(round(self._now(), 6), proc, call, outcome, key)
        self.count += 1
        self._hash.update(line.text().encode())
        self._hash.update(b"\n")
        if self._keep or key:
            self.lines.append(line)

    def digest(self) -> str:
        """A hash of every line (kept or not): equal digests, equal runs."""
        return self._hash.hexdigest()

    def story(self, last: int | None = None) -> list[Line]:
        lines = [ln for ln in self.lines if ln.key]
        return lines if last is None else lines[-last:]


def render(lines: Iterable[Line]) -> str:
    return "\n".join(ln.text() for ln in lines)
