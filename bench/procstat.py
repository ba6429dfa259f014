"""CPU time from ``/proc``, shared by the benchmarks that measure a component's cost."""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat: str | Path) -> float:
    """User + system CPU seconds from a ``/proc`` stat file: a process's
    (``/proc/<pid>/stat``) or one thread's (``/proc/<pid>/task/<tid>/stat``)."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def process_cpu_seconds(pid: int) -> float:
    return cpu_seconds(f"/proc/{pid}/stat")
