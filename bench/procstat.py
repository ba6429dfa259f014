"""CPU time from ``/proc`` and py-spy profiles, shared by the benchmarks that measure a
component's cost."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat: str | Path) -> float:
    """User + system CPU seconds from a ``/proc`` stat file: a process's
    (``/proc/<pid>/stat``) or one thread's (``/proc/<pid>/task/<tid>/stat``)."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def process_cpu_seconds(pid: int) -> float:
    return cpu_seconds(f"/proc/{pid}/stat")


def profile(
    pid: int,
    seconds: float,
    out: Path,
    *,
    what: str,
    thread: int | None = None,
    rate: int = 50,
) -> None:
    """Sample process ``pid`` with py-spy (``$PY_SPY`` or ``py-spy`` on PATH) for
    ``seconds`` at ``rate`` samples a second (only the thread whose native id is
    ``thread``, when given); print the functions holding the most samples, self and
    inclusive."""
    spy = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if not spy:
        raise SystemExit("profiling needs py-spy: set PY_SPY or put it on PATH")
    args = [spy, "record", "--format", "raw", "-r", str(rate), "-d", str(int(seconds))]
    args += ["-p", str(pid), "-o", str(out), *(["--threads"] if thread is not None else [])]
    subprocess.run(args, check=True, capture_output=True)
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if thread is not None:
            if not frames[0].startswith(f"thread ({thread})"):
                continue
            frames = frames[1:]
        if not frames:
            continue
        n = int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    print(f"{what}: {total} samples in {seconds:g} s ({rate}/s while on CPU)")
    for title, table in (("self", own), ("inclusive", inclusive)):
        print(f"  top {title}:")
        for frame, n in sorted(table.items(), key=lambda kv: -kv[1])[:25]:
            print(f"    {100 * n / max(total, 1):5.1f}%  {frame}")
    print(f"  stacks: {out}")
